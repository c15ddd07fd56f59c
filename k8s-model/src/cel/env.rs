//! The CEL environment selectors compile and run in, built once per process: the CEL
//! standard library, the strings and lists extensions, the Kubernetes quantity and semver
//! libraries, the DRA `includes()` function and the `cel.bind()` macro. Pure.

use std::sync::{Arc, LazyLock};

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{CelBool, DYN_TYPE, Kind};
use cel::common::value::CowVal;
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env, ExecutionError};

use super::{cost, quantity, semver};

/// The most list elements `includes()` looks at (`ResourceSliceMaxAttributeValuesPerDevice`).
pub const INCLUDES_MAX_LIST_LEN: usize = 48;

/// The shared environment. Building it only fails on a programming error (a name
/// declared twice), which the unit tests catch.
pub fn environment() -> &'static Arc<Env> {
    static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
        #[allow(
            clippy::expect_used,
            reason = "a fixed declaration list; its unit tests build it"
        )]
        Arc::new(build().expect("the DRA CEL environment declares each overload once"))
    });
    &ENV
}

fn build() -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)?;
    env.add_extension(cel::extensions::lists)?;
    env.add_extension(quantity::library)?;
    env.add_extension(semver::library)?;
    env.add_member_overload(
        "includes",
        "dra_includes_dyn_dyn",
        DYN_TYPE,
        vec![DYN_TYPE],
        includes,
    )?;
    env.add_macro(Macro::receiver("bind", 3, bind_macro))?;
    // The cost meter's functions (`cost::instrument` calls them; no source can: their
    // names are not identifiers).
    env.add_overload(
        cost::CHARGE,
        "tessera_cost_dyn",
        vec![DYN_TYPE],
        cost::charge_value,
    )?;
    env.add_overload(
        cost::CHARGE_COUNT,
        "tessera_cost_count_dyn",
        vec![DYN_TYPE],
        cost::charge_count,
    )?;
    env.add_overload(
        cost::REPLACE,
        "tessera_replace_3",
        vec![DYN_TYPE, DYN_TYPE, DYN_TYPE],
        cost::replace,
    )?;
    env.add_overload(
        cost::REPLACE,
        "tessera_replace_4",
        vec![DYN_TYPE, DYN_TYPE, DYN_TYPE, DYN_TYPE],
        cost::replace,
    )?;
    Ok(env)
}

/// `target.includes(value)`: for a list, whether an element equals `value` (lists longer
/// than [`INCLUDES_MAX_LIST_LEN`] are an error); otherwise whether `target == value`.
fn includes<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [target, value]: [CowVal<'b, 'v>; 2] = args
        .try_into()
        .map_err(|args: Vec<_>| ExecutionError::invalid_argument_count(2, args.len()))?;
    let found = match target.as_iterable() {
        Some(list) if target.get_type().kind() == Kind::List => {
            let mut items = list.iter();
            let mut seen = 0;
            let mut found = false;
            while let Some(item) = items.next() {
                if seen >= INCLUDES_MAX_LIST_LEN {
                    return Err(ExecutionError::function_error(
                        "includes",
                        format!(
                            "'includes' function cannot be applied to lists longer than {INCLUDES_MAX_LIST_LEN} values"
                        ),
                    ));
                }
                if item.equals(value.as_ref()) {
                    found = true;
                    break;
                }
                seen += 1;
            }
            found
        }
        _ => target.equals(value.as_ref()),
    };
    Ok(CowVal::owned(CelBool::from(found)))
}

/// Expands `cel.bind(var, init, result)` as cel-go's `ext.Bindings` does: a comprehension
/// over an empty list whose accumulator `var` holds `init` while `result` is evaluated.
fn bind_macro(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(ns)) if ns == "cel") {
        return Ok(None);
    }
    let var = match &args[0].expr {
        Expr::Ident(name) => name.clone(),
        _ => {
            return Err(helper.new_error(
                args[0].id,
                "cel.bind() variable names must be simple identifiers",
            ));
        }
    };
    let (Some(result), Some(init)) = (args.pop(), args.pop()) else {
        return Err(helper.new_error(0, "cel.bind() takes three arguments"));
    };
    target.take();
    let comprehension = ComprehensionExpr {
        iter_range: helper.next_expr(Expr::List(ListExpr::new(Vec::new()))),
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: var.clone(),
        accu_init: init,
        loop_cond: helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into()))),
        loop_step: helper.next_expr(Expr::Ident(var)),
        result,
    };
    Ok(Some(
        helper.next_expr(Expr::Comprehension(Box::new(comprehension))),
    ))
}

/// Evaluates `expression` with no variables, for the library tests.
#[cfg(test)]
pub(crate) fn eval_standalone(expression: &str) -> Result<cel::Value, String> {
    let env = environment();
    let program = env.compile(expression).map_err(|e| e.to_string())?;
    let ctx = cel::Context::with_env(Arc::clone(env));
    program.execute(&ctx).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::eval_standalone;
    use cel::Value;

    /// The environment builds: no overload or macro is declared twice.
    #[test]
    fn environment_builds() {
        super::build().unwrap();
    }

    /// `cel.bind` binds a name for its body, shadows outer names and rejects non-identifiers.
    #[test]
    fn bind_binds_a_simple_identifier() {
        let cases: &[(&str, Value)] = &[
            ("cel.bind(x, 2, x * x) == 4", Value::Bool(true)),
            (
                "cel.bind(x, 1, cel.bind(x, x + 1, x)) == 2",
                Value::Bool(true),
            ),
            (
                r#"cel.bind(s, "ab", s + s)"#,
                Value::String("abab".to_owned().into()),
            ),
        ];
        for (expression, want) in cases {
            assert_eq!(
                eval_standalone(expression).as_ref(),
                Ok(want),
                "{expression}"
            );
        }
        let err = eval_standalone("cel.bind(a.b, 1, true)").unwrap_err();
        assert!(err.contains("simple identifiers"), "{err}");
        assert!(eval_standalone("x.bind(y, 1, true)").is_err());
    }

    /// `includes` is membership for lists and equality for scalars, bounded to 48 elements.
    #[test]
    fn includes_handles_scalars_and_lists() {
        let cases: &[(&str, Value)] = &[
            ("[1, 2, 3].includes(2)", Value::Bool(true)),
            ("[1, 2, 3].includes(4)", Value::Bool(false)),
            (r#""a".includes("a")"#, Value::Bool(true)),
            (r#""ab".includes("a")"#, Value::Bool(false)),
            (
                "[semver(\"1.0.0\")].includes(semver(\"1.0.0+b\"))",
                Value::Bool(true),
            ),
            ("lists.range(48).includes(47)", Value::Bool(true)),
        ];
        for (expression, want) in cases {
            assert_eq!(
                eval_standalone(expression).as_ref(),
                Ok(want),
                "{expression}"
            );
        }
        let err = eval_standalone("lists.range(49).includes(48)").unwrap_err();
        assert!(err.contains("longer than 48 values"), "{err}");
    }
}
