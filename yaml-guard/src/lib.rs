//! Refuses YAML whose flow collections nest deeper than the deserializer accepts, before
//! anything parses it, at a cost linear in the text.
//!
//! Why: the YAML scanner (libyaml's, as `unsafe-libyaml` ports it for `serde_yaml_ng`)
//! looks at every open flow level (`{`, `[`) for each token it reads, so N nested flow
//! collections cost O(N²): 10,000 nested `{a: ` (40 KB) take 1.1 s, 20,000 take 4.2 s
//! (found by fuzzing `node_config`). `serde_yaml_ng` refuses nesting deeper than 128, but
//! only after its loader has scanned the whole document.
//!
//! [`check`] runs the same scanner, set up as `serde_yaml_ng` sets it up, token by token,
//! and stops at the first flow collection deeper than [`MAX_FLOW_DEPTH`]. Every token it
//! is handed was scanned at most that deep (only the scanner's look-ahead for a simple
//! key, at most 1,024 bytes, goes further, once), so the check is linear. Scanner errors
//! are left to the real parse, which reports them with its own message.
//!
//! What it refuses, the deserializer would refuse too, for a caller that deserializes
//! every document of the stream into a type that visits every collection (a `Value`, or
//! structs that deny unknown fields): `serde_yaml_ng` counts depth only for collections it
//! visits, and skips ignored content at any depth. Tessera's callers are of that kind.

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
    // SAFETY: `yaml_parser_initialize` zeroes and sets up `*p`, which stays in place
    // (the parser keeps a pointer to itself) until `yaml_parser_delete`, called once on
    // every path after it; in this version it aborts rather than fail, and a failure
    // would leave nothing to free. The input pointer and length describe `text`, which
    // outlives the parser, and the scanner only reads it. `yaml_parser_scan` zeroes each
    // token before filling it; a token it returned is read, then freed once with
    // `yaml_token_delete`; on failure it owns nothing. Tokens still queued are freed
    // with the parser.
    unsafe {
        if unsafe_libyaml::yaml_parser_initialize(p).fail {
            return Ok(());
        }
        unsafe_libyaml::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
        // As `serde_yaml_ng` does: left unset, the reader would consume a BOM that the
        // parser's scanner sees, and the two would read `\u{FEFF}--- [` differently.
        unsafe_libyaml::yaml_parser_set_encoding(p, unsafe_libyaml::YAML_UTF8_ENCODING);
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

    /// `n` flow sequences nested at the top of the document.
    fn nested(levels: usize) -> String {
        format!("{}1{}\n", "[".repeat(levels), "]".repeat(levels))
    }

    fn loads(text: &str) -> bool {
        serde_yaml_ng::from_str::<serde_json::Value>(text).is_ok()
    }

    /// The guard and the deserializer draw the line at the same depth: both take 128
    /// levels, both refuse 129.
    #[test]
    fn the_guard_refuses_only_what_the_deserializer_would_refuse() {
        assert!(check(&nested(MAX_FLOW_DEPTH)).is_ok());
        assert!(loads(&nested(MAX_FLOW_DEPTH)));
        assert!(!loads(&nested(MAX_FLOW_DEPTH + 1)));
        let e = check(&nested(MAX_FLOW_DEPTH + 1)).unwrap_err();
        assert_eq!((e.line, e.column), (1, 1 + MAX_FLOW_DEPTH as u64));
        assert!(
            e.to_string()
                .contains("more than 128 deep at line 1, column 129"),
            "{e}"
        );
    }

    /// Brackets that are not flow collections (in quotes, plain scalars, comments, block
    /// scalars, after a BOM that makes `--- [` a scalar) do not count, nor do collections
    /// that close before the next opens.
    #[test]
    fn only_open_flow_collections_count() {
        let deep_text = "[".repeat(1_000);
        let doc = format!(
            "a: '{deep_text}'\nb: \"{deep_text}\"\nc: x{deep_text}\n# {deep_text}\nd: |\n  {deep_text}\n"
        );
        assert!(check(&doc).is_ok());
        assert!(check(&"- [[1], {a: [2]}]\n".repeat(10_000)).is_ok());
        let bom = format!("\u{FEFF}--- {}", "[".repeat(200));
        assert!(loads(&bom), "serde_yaml_ng reads it as one scalar");
        assert!(check(&bom).is_ok());
    }

    /// The hang the fuzzer found, `{&ch: {&catcch: …` 20,000 deep, is refused at the
    /// 129th level, in a later document too; text the scanner cannot read is left to the
    /// parser even when it is deep.
    #[test]
    fn deep_nesting_is_refused_before_the_quadratic_part() {
        let hang = format!("x: {}", "{&a b: ".repeat(20_000));
        let e = check(&hang).unwrap_err();
        assert_eq!((e.line, e.column), (1, 4 + 7 * MAX_FLOW_DEPTH as u64));
        let second = format!("a: 1\n---\n{}", "[".repeat(200));
        assert_eq!(check(&second).unwrap_err().line, 3);
        assert!(check(&format!("@{}", "[".repeat(200))).is_ok());
        assert!(check("\"unterminated").is_ok());
        assert!(check("").is_ok());
    }
}
