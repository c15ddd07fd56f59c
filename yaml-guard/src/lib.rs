//! Refuses YAML whose flow collections nest deeper than the deserializer accepts, before
//! anything parses it, at a cost linear in the text.
//!
//! Why: the YAML scanner (libyaml's, as `unsafe-libyaml` ports it for `serde_yaml_ng`)
//! looks at every open flow level (`{`, `[`) for each token it reads, so N nested flow
//! collections cost O(N²): 10,000 nested `{a: ` (40 KB) take 1.1 s, 20,000 take 4.2 s
//! (found by fuzzing `node_config`). `serde_yaml_ng` refuses nesting deeper than 128, but
//! only after its loader has scanned the whole document.
//!
//! [`check`] runs the same scanner token by token and stops at the first flow collection
//! deeper than [`MAX_FLOW_DEPTH`]. Up to there every token costs at most that depth (plus
//! the scanner's own look-ahead of 1,024 characters for a simple key), so the check is
//! linear. What it refuses, the deserializer would refuse too (its recursion limit), so it
//! never turns away a file that would otherwise load; it only does so before the
//! quadratic part. Scanner errors are left to the real parse, which reports them with its
//! own message.

use std::mem::MaybeUninit;

/// The deepest flow nesting passed on: `serde_yaml_ng` refuses any document nested more
/// than 128 collections deep, and a flow collection nests at least as deep as its level.
pub const MAX_FLOW_DEPTH: usize = 128;

/// Flow collections nested deeper than [`MAX_FLOW_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "YAML flow collections ('{{' or '[') nested more than {MAX_FLOW_DEPTH} deep at line \
     {line}, column {column}: refused before parsing (the parser's cost grows with the \
     square of the nesting, and it would refuse the document anyway)"
)]
pub struct TooDeep {
    /// 1-based line of the first collection past the limit.
    pub line: u64,
    /// 1-based column of it.
    pub column: u64,
}

/// `Err` when `text` opens a flow collection more than [`MAX_FLOW_DEPTH`] deep; `Ok` for
/// anything else, including text the scanner cannot read (the parse says why).
pub fn check(text: &str) -> Result<(), TooDeep> {
    let mut parser = MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit();
    let p = parser.as_mut_ptr();
    // SAFETY: `yaml_parser_initialize` zeroes and sets up `*p` (it fails only when it
    // cannot allocate, and then has freed what it took). The input pointer and length
    // describe `text`, which outlives the parser, and the scanner only reads it. Each
    // token is filled by `yaml_parser_scan` before it is read, and freed once with
    // `yaml_token_delete`; the parser is freed once with `yaml_parser_delete`, on every
    // path after it was initialised.
    unsafe {
        if unsafe_libyaml::yaml_parser_initialize(p).fail {
            return Ok(());
        }
        unsafe_libyaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        let mut depth = 0usize;
        let mut result = Ok(());
        loop {
            let mut token = MaybeUninit::<unsafe_libyaml::yaml_token_t>::uninit();
            let t = token.as_mut_ptr();
            if unsafe_libyaml::yaml_parser_scan(p, t).fail {
                break;
            }
            let kind = (*t).type_;
            let mark = (*t).start_mark;
            unsafe_libyaml::yaml_token_delete(t);
            match kind {
                unsafe_libyaml::YAML_FLOW_SEQUENCE_START_TOKEN
                | unsafe_libyaml::YAML_FLOW_MAPPING_START_TOKEN => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        result = Err(TooDeep {
                            line: mark.line + 1,
                            column: mark.column + 1,
                        });
                        break;
                    }
                }
                unsafe_libyaml::YAML_FLOW_SEQUENCE_END_TOKEN
                | unsafe_libyaml::YAML_FLOW_MAPPING_END_TOKEN => {
                    depth = depth.saturating_sub(1);
                }
                unsafe_libyaml::YAML_STREAM_END_TOKEN | unsafe_libyaml::YAML_NO_TOKEN => break,
                _ => {}
            }
        }
        unsafe_libyaml::yaml_parser_delete(p);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!("x: {}1{}\n", "[".repeat(levels), "]".repeat(levels))
    }

    fn loads(text: &str) -> bool {
        serde_yaml_ng::from_str::<serde_json::Value>(text).is_ok()
    }

    /// The guard and the deserializer draw the line at the same depth: what the guard
    /// passes at the limit loads, one level more is refused by both.
    #[test]
    fn the_guard_refuses_only_what_the_deserializer_would_refuse() {
        let deepest = (1..=200).rev().find(|&n| loads(&nested(n))).unwrap_or(0);
        assert!(
            deepest < MAX_FLOW_DEPTH,
            "the deserializer loads {deepest} levels"
        );
        assert!(check(&nested(MAX_FLOW_DEPTH)).is_ok());
        assert!(!loads(&nested(MAX_FLOW_DEPTH + 1)));
        let e = check(&nested(MAX_FLOW_DEPTH + 1)).unwrap_err();
        assert_eq!((e.line, e.column), (1, 4 + MAX_FLOW_DEPTH as u64));
        assert!(
            e.to_string()
                .contains("more than 128 deep at line 1, column 132"),
            "{e}"
        );
    }

    /// Brackets that are not flow collections (in quotes, plain scalars, comments, block
    /// scalars) do not count, nor do collections that close before the next opens.
    #[test]
    fn only_open_flow_collections_count() {
        let deep_text = "[".repeat(1_000);
        let doc = format!(
            "a: '{deep_text}'\nb: \"{deep_text}\"\nc: x{deep_text}\n# {deep_text}\nd: |\n  {deep_text}\n"
        );
        assert!(check(&doc).is_ok());
        assert!(check(&"- [[1], {a: [2]}]\n".repeat(10_000)).is_ok());
    }

    /// The hang the fuzzer found, `{&ch: {&catcch: …` 20,000 deep, is refused at once;
    /// text the scanner cannot read is left to the parser.
    #[test]
    fn deep_nesting_is_refused_before_the_quadratic_part() {
        let hang = format!("x: {}", "{&a b: ".repeat(20_000));
        let e = check(&hang).unwrap_err();
        assert_eq!(e.line, 1);
        assert!(check("a: [b\n  c: ]]]").is_ok());
        assert!(check("\"unterminated").is_ok());
        assert!(check("").is_ok());
    }
}
