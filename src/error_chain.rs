//! One line for an error and its causes (`outer: cause: root cause`), the form the
//! kubelet's per-claim error strings and the plugin's logs use.

/// `e` and each of its sources, joined with `": "`.
pub fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    /// Every cause appears once, outermost first.
    #[test]
    fn joins_the_causes_outermost_first() {
        let e = Outer(std::io::Error::other("root"));
        assert_eq!(cause_chain(&e), "outer: root");
    }
}
