//! Prometheus text from the API server's and the scheduler's `/metrics`: samples,
//! counter sums, and histogram quantiles over the difference of two scrapes (pure).

use std::collections::BTreeMap;

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One scrape.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

/// Parses the text exposition format (comments skipped; a line that does not parse is
/// skipped too: only the metrics asked for matter).
pub fn parse(text: &str) -> Scrape {
    let mut samples = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, rest) = match line.find('{') {
            Some(i) => match line[i..].find('}') {
                Some(j) => (&line[..i], Some((&line[i + 1..i + j], &line[i + j + 1..]))),
                None => continue,
            },
            None => (line, None),
        };
        let (name, labels, value) = match rest {
            Some((labels, value)) => (head, parse_labels(labels), value),
            None => match head.split_once(' ') {
                Some((n, v)) => (n, BTreeMap::new(), v),
                None => continue,
            },
        };
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Scrape { samples }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = &rest[eq + 1..];
        let Some(body) = after.strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut end = None;
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(end) = end else { break };
        out.insert(key, value);
        rest = &body[end + 1..];
    }
    out
}

impl Scrape {
    /// The sum of `name`'s samples whose labels pass `keep`.
    pub fn sum(&self, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && keep(&s.labels))
            .map(|s| s.value)
            .sum()
    }

    /// `name`'s samples grouped by the values of `by` (summed), filtered by `keep`.
    pub fn group(
        &self,
        name: &str,
        by: &[&str],
        keep: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<Vec<String>, f64> {
        let mut out = BTreeMap::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == name && keep(&s.labels))
        {
            let key = by
                .iter()
                .map(|k| s.labels.get(*k).cloned().unwrap_or_default())
                .collect();
            *out.entry(key).or_insert(0.0) += s.value;
        }
        out
    }

    /// The cumulative buckets of histogram `name` (the `_bucket` series), summed over
    /// the series `keep` passes: (upper bound, count), ascending.
    pub fn buckets(
        &self,
        name: &str,
        keep: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Vec<(f64, f64)> {
        let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let bucket = format!("{name}_bucket");
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == bucket && keep(&s.labels))
        {
            let Some(le) = s.labels.get("le").and_then(|l| l.parse::<f64>().ok()) else {
                continue;
            };
            let e = by_le.entry(le.to_bits()).or_insert((le, 0.0));
            e.1 += s.value;
        }
        let mut v: Vec<(f64, f64)> = by_le.into_values().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// `after - before` of two cumulative bucket lists with the same bounds (a bound
/// missing before counts from 0).
pub fn bucket_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map(|(_, c)| *c)
                .unwrap_or(0.0);
            (*le, n - was)
        })
        .collect()
}

/// The `q` quantile of cumulative buckets, interpolated linearly inside its bucket (as
/// Prometheus' `histogram_quantile`); `None` without observations. A quantile in the
/// `+Inf` bucket is reported as the largest finite bound.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let in_bucket = count - prev.1;
            let frac = if in_bucket > 0.0 {
                (rank - prev.1) / in_bucket
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, count);
    }
    Some(prev.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Labels with commas and escaped quotes in values parse, and sums filter by label.
    #[test]
    fn parses_labels_and_sums_counters() {
        let s = parse(
            "# HELP x y\napiserver_request_total{code=\"200\",resource=\"resourceslices\",verb=\"LIST\",x=\"a,\\\"b\"} 7\napiserver_request_total{code=\"201\",resource=\"resourceslices\",verb=\"POST\"} 3\nup 1\n",
        );
        assert_eq!(s.sum("apiserver_request_total", |_| true), 10.0);
        assert_eq!(
            s.sum("apiserver_request_total", |l| l["verb"] == "POST"),
            3.0
        );
        assert_eq!(s.samples[0].labels["x"], "a,\"b");
        assert_eq!(s.sum("up", |_| true), 1.0);
    }

    /// Quantiles interpolate inside the bucket holding the rank, over a difference.
    #[test]
    fn quantiles_of_a_bucket_difference() {
        let before = vec![(0.1, 1.0), (0.2, 1.0), (f64::INFINITY, 1.0)];
        let after = vec![(0.1, 51.0), (0.2, 101.0), (f64::INFINITY, 101.0)];
        let d = bucket_delta(&before, &after);
        assert_eq!(quantile(&d, 0.5), Some(0.1));
        let p95 = quantile(&d, 0.95).unwrap_or_default();
        assert!((p95 - 0.19).abs() < 1e-9, "{p95}");
        assert_eq!(quantile(&[(1.0, 0.0)], 0.5), None);
    }
}
