//! A compiled device selector: the CEL expression of a DeviceClass or request selector,
//! parsed once and evaluated against many devices. Pure and deterministic.

use std::sync::Arc;

use cel::common::types::CelBool;
use cel::{Context, IdedExpr, Value};

use super::cost;
use super::device::{DeviceInput, device_value};
use super::env::environment;

/// The longest expression accepted, in bytes (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_LEN: usize = 10 * 1024;

/// Why a selector could not be compiled or evaluated. `Display` follows the scheduler's
/// wording ("CEL compile error: ...", "CEL runtime error: ..."); the caller adds which
/// class or claim and which selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression is longer than [`MAX_EXPRESSION_LEN`] bytes.
    #[error(
        "CEL compile error: expression too long: {len} bytes, may not be more than {MAX_EXPRESSION_LEN} bytes"
    )]
    TooLong { len: usize },
    /// The expression does not parse; carries the parser's message
    /// (`ERROR: <input>:line:col: ...` with a caret snippet, as cel-go prints it).
    #[error("CEL compile error: compilation failed: {0}")]
    Compile(String),
    /// Evaluation failed: a missing key, no matching overload, an invalid quantity, or a
    /// device attribute or capacity that cannot be converted.
    #[error("CEL runtime error: {0}")]
    Eval(String),
    /// Evaluation went past the cost limit ([`super::MAX_COST`]); cel-go's wording.
    #[error("CEL runtime error: {}", super::cost::COST_EXCEEDED)]
    CostLimit,
    /// The expression evaluated to a value of this CEL type instead of a bool.
    #[error(
        "CEL runtime error: CEL result of type {0} could not be converted to bool (expression must return bool)"
    )]
    NotBool(String),
}

/// A compiled selector expression. Compiling parses once; [`DeviceSelector::matches`]
/// only evaluates. Shareable across threads.
#[derive(Debug)]
pub struct DeviceSelector {
    expression: String,
    /// The parsed expression with the cost meter's calls ([`super::cost::instrument`]).
    metered: IdedExpr,
}

impl DeviceSelector {
    /// Compiles `expression`. Errors: [`CelError::TooLong`] above 10 KiB (10240 bytes),
    /// [`CelError::Compile`] with the parser's message on a syntax error. There is no
    /// type checker: type errors and unknown functions surface when evaluating.
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(CelError::TooLong {
                len: expression.len(),
            });
        }
        let program = environment()
            .compile(expression)
            .map_err(|e| CelError::Compile(e.to_string()))?;
        Ok(DeviceSelector {
            expression: expression.to_owned(),
            metered: cost::instrument(program.expression()),
        })
    }

    /// Evaluates the selector against one device. Errors: [`CelError::Eval`] when the
    /// device cannot be converted or evaluation fails, [`CelError::NotBool`] when the
    /// result is not a bool, [`CelError::CostLimit`] past [`super::MAX_COST`].
    /// Deterministic.
    pub fn matches(&self, device: &DeviceInput<'_>) -> Result<bool, CelError> {
        self.matches_within(device, super::MAX_COST)
    }

    /// [`DeviceSelector::matches`] with another cost limit (tests).
    pub fn matches_within(&self, device: &DeviceInput<'_>, limit: u64) -> Result<bool, CelError> {
        let value = device_value(device)?;
        let mut ctx = Context::with_env(Arc::clone(environment()));
        ctx.add_variable_as_val("device", Box::new(value));
        cost::start(limit);
        let result = Value::resolve_val(&self.metered, &ctx);
        // An exceeded limit wins over any result: `||` or `all()` may have absorbed it.
        if cost::finish() {
            return Err(CelError::CostLimit);
        }
        let result = result.map_err(|e| CelError::Eval(e.to_string()))?;
        match result.downcast_ref::<CelBool>() {
            Some(matched) => Ok(*matched.inner()),
            None => Err(CelError::NotBool(result.get_type().name().to_owned())),
        }
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Selectors can be compiled once and shared by scheduler threads.
    #[test]
    fn selectors_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<DeviceSelector>();
        assert_send_sync::<CelError>();
    }

    /// The size limit is inclusive: 10240 bytes compile, 10241 do not.
    #[test]
    fn size_limit_is_ten_kibibytes_inclusive() {
        let at_limit = format!("true{}", " ".repeat(MAX_EXPRESSION_LEN - 4));
        assert!(DeviceSelector::compile(&at_limit).is_ok());
        let over = format!("{at_limit} ");
        assert_eq!(
            DeviceSelector::compile(&over).unwrap_err(),
            CelError::TooLong {
                len: MAX_EXPRESSION_LEN + 1
            }
        );
    }

    fn eval(expression: &str) -> Result<bool, CelError> {
        let device = k8s_openapi::api::resource::v1::Device {
            name: "gpu-0".into(),
            ..Default::default()
        };
        let input = DeviceInput {
            driver: "gpu.tessera.dev",
            device: &device,
            consumable_capacity: false,
        };
        DeviceSelector::compile(expression).unwrap().matches(&input)
    }

    /// Selectors that would run for hours or allocate without bound stop at the cost
    /// limit with cel-go's message, within seconds: nested comprehensions, doubling
    /// strings and lists, a huge `lists.range`, a growing `replace`; an `||` or `all()`
    /// that absorbs the error does not hide it. Each evaluation's time is printed; the
    /// bound, 120 s, is far from both sides: the slowest case (the nested `map`) took
    /// 6 s in a debug build beside a benchmark and 12 s with both cores busy elsewhere,
    /// and a selector the limit missed would run for hours.
    #[test]
    fn runaway_selectors_stop_at_the_cost_limit() {
        let doubling = |seed: &str| {
            let mut e = "v29.size() > 0".to_string();
            for i in (1..30).rev() {
                e = format!("cel.bind(v{i}, v{} + v{}, {e})", i - 1, i - 1);
            }
            format!("cel.bind(v0, {seed}, {e})")
        };
        let cases = [
            // 10^12 iterations.
            "lists.range(1000).all(a, lists.range(1000).all(b, lists.range(1000).all(c, lists.range(1000).all(d, true))))".to_string(),
            "lists.range(1000).exists(a, lists.range(1000).exists(b, lists.range(1000).exists(c, false)))".to_string(),
            "lists.range(1000).map(a, lists.range(1000).map(b, lists.range(1000).map(c, c))).size() == 0".to_string(),
            // 16 GiB and 2^29 elements.
            doubling(r#""0123456789abcdef""#),
            doubling("[1]"),
            "lists.range(4000000000).size() > 0".to_string(),
            r#""abcdefgh".replace("", "abcdefgh").replace("", "abcdefgh").replace("", "abcdefgh").replace("", "abcdefgh").replace("", "abcdefgh").replace("", "abcdefgh").replace("", "abcdefgh").size() > 0"#.to_string(),
            // The error is absorbed by `||` and by `exists()`, yet reported.
            "lists.range(1000).all(a, lists.range(1000).all(b, lists.range(1000).all(c, true))) || true".to_string(),
            "lists.range(2000).exists(a, lists.range(2000).all(b, b >= 0) && false) || true".to_string(),
        ];
        // Thirty nested `cel.bind`s parse and evaluate deeper than a debug build's
        // 2 MiB test thread allows (the parser's depth limit, 96, bounds it).
        let run = move || {
            for expression in cases {
                let t = std::time::Instant::now();
                assert_eq!(eval(&expression), Err(CelError::CostLimit), "{expression}");
                let took = t.elapsed();
                println!("{took:>12.3?}  {expression}");
                assert!(took.as_secs() < 120, "{expression}: {took:?}");
            }
        };
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(
            CelError::CostLimit.to_string(),
            "CEL runtime error: operation cancelled: actual cost limit exceeded"
        );
    }

    /// Ordinary selectors, comprehensions over attribute-sized lists included, stay far
    /// below the limit and keep their results.
    #[test]
    fn ordinary_selectors_are_within_the_cost_limit() {
        for (expression, want) in [
            (
                "lists.range(48).all(a, lists.range(48).all(b, a + b >= 0))",
                true,
            ),
            (
                "lists.range(48).map(x, x * 2).filter(x, x > 90).size() == 2",
                true,
            ),
            ("lists.range(48).exists_one(x, x == 7)", true),
            (r#""a-b-c".replace("-", "") == "abc""#, true),
            (r#""a-b-c".replace("-", "", 1) == "ab-c""#, true),
            (r#""aaa".replace("", "x") == "xaxaxax""#, true),
            (r#"["a", "b"].join("-") == "a-b""#, true),
            ("[1, 2].all(x, x / 0 == 1) || true", true),
            ("cel.bind(x, [1, 2], x + x).size() == 4", true),
            (r#"device.driver == "gpu.tessera.dev""#, true),
            ("{'a': 1}.a == 1 && has({'a': 1}.a)", true),
        ] {
            assert_eq!(eval(expression), Ok(want), "{expression}");
        }
        assert!(matches!(
            eval("[1, 2].all(x, x / 0 == 1)"),
            Err(CelError::Eval(_))
        ));
    }
}
