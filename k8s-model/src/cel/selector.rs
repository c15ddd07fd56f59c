//! A compiled device selector: the CEL expression of a DeviceClass or request selector,
//! parsed once and evaluated against many devices. Pure and deterministic.

use std::sync::Arc;

use cel::common::types::CelBool;
use cel::{Context, Program, Value};

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
    program: Program,
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
            program,
        })
    }

    /// Evaluates the selector against one device. Errors: [`CelError::Eval`] when the
    /// device cannot be converted or evaluation fails, [`CelError::NotBool`] when the
    /// result is not a bool. Deterministic; no cost limit is enforced (see the module
    /// documentation).
    pub fn matches(&self, device: &DeviceInput<'_>) -> Result<bool, CelError> {
        let value = device_value(device)?;
        let mut ctx = Context::with_env(Arc::clone(environment()));
        ctx.add_variable_as_val("device", Box::new(value));
        let result = Value::resolve_val(self.program.expression(), &ctx)
            .map_err(|e| CelError::Eval(e.to_string()))?;
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
}
