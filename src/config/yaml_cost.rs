//! A bound on what parsing a node's YAML file may cost, checked before the parser runs.
//!
//! The YAML scanner (libyaml's, as `unsafe-libyaml` ports it for `serde_yaml_ng`) looks
//! at every open flow level (`{`, `[`) for each token it reads, so N unclosed flow
//! collections cost O(N²): 10,000 nested `{a: ` (40 KB) take 1.1 s to parse, 20,000 take
//! 4.2 s (found by fuzzing `node_config`). The deserializer refuses nesting deeper than
//! 128, but only after the scanner has read the whole document.
//!
//! The bound is sound without parsing: tokens ≤ bytes, and the open flow levels never
//! exceed the number of `{` and `[` characters in the text, so bytes × those characters
//! bounds the scanner's work. A node config or a mock node is a few KB with a few dozen
//! of them (the examples: under 10⁵), far below [`MAX_COST`].

/// Bytes × `{`/`[` characters a node file may have: about 50 ms of scanning at worst.
pub const MAX_COST: u64 = 10_000_000;

/// `Err` with the reason when `text` could cost the YAML scanner more than [`MAX_COST`].
pub fn check(text: &str) -> Result<(), String> {
    let opens = text.bytes().filter(|b| matches!(b, b'{' | b'[')).count() as u64;
    let bytes = text.len() as u64;
    if bytes.saturating_mul(opens) > MAX_COST {
        return Err(format!(
            "{opens} flow collections ('{{' or '[') in {bytes} bytes: more than a node file \
             needs, and the YAML parser's cost grows with their product (at most {MAX_COST})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped files are far inside the bound; deep nesting is refused at once.
    #[test]
    fn nested_flow_collections_are_refused_before_parsing() {
        let mock = include_str!("../../examples/mock-node.yaml");
        assert!(check(mock).is_ok());
        let nested = format!("x: {}", "{a: ".repeat(2_000));
        let e = check(&nested).unwrap_err();
        assert!(e.contains("2000 flow collections"), "{e}");
        // A long file without flow collections, and a short one with many, pass.
        assert!(check(&"a: b\n".repeat(100_000)).is_ok());
        assert!(check(&"[".repeat(1_000)).is_ok());
    }
}
