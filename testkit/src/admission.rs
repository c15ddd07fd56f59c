//! Evaluating a ValidatingAdmissionPolicy's CEL the way the API server does, with the
//! admission variables `object`, `oldObject`, `request` and `variables`: match
//! conditions first (any false: the policy does not apply), then the variables in order,
//! then each validation (false, or an evaluation error under `failurePolicy: Fail`,
//! denies). Used to test the policies Tessera ships; pure.

use std::sync::Arc;

use cel::{Context, Program, Value};
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;

use k8s_model::cel::CelError;
use k8s_model::cel::env::environment;

/// What the policy decides for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    Allowed,
    /// Denied by the validation at this index, with its message (or the evaluation
    /// error, which `failurePolicy: Fail` turns into a denial).
    Denied {
        validation: usize,
        message: String,
    },
}

struct Validation {
    program: Program,
    message: String,
    message_expression: Option<Program>,
}

/// A compiled policy.
pub struct AdmissionPolicy {
    match_conditions: Vec<Program>,
    variables: Vec<(String, Program)>,
    validations: Vec<Validation>,
}

fn compile(expr: &str) -> Result<Program, CelError> {
    environment()
        .compile(expr)
        .map_err(|e| CelError::Compile(format!("{expr:?}: {e}")))
}

impl AdmissionPolicy {
    /// Compiles every expression of the policy. A denial reports the validation's
    /// `messageExpression` when it evaluates to a string, else its `message` (or the
    /// expression text), as the API server does.
    pub fn compile(p: &ValidatingAdmissionPolicy) -> Result<Self, CelError> {
        let spec = p.spec.as_ref();
        let match_conditions = spec
            .and_then(|s| s.match_conditions.as_ref())
            .into_iter()
            .flatten()
            .map(|m| compile(&m.expression))
            .collect::<Result<_, _>>()?;
        let variables = spec
            .and_then(|s| s.variables.as_ref())
            .into_iter()
            .flatten()
            .map(|v| Ok((v.name.clone(), compile(&v.expression)?)))
            .collect::<Result<_, CelError>>()?;
        let validations = spec
            .and_then(|s| s.validations.as_ref())
            .into_iter()
            .flatten()
            .map(|v| {
                Ok(Validation {
                    program: compile(&v.expression)?,
                    message: v.message.clone().unwrap_or_else(|| v.expression.clone()),
                    message_expression: v.message_expression.as_deref().map(compile).transpose()?,
                })
            })
            .collect::<Result<_, CelError>>()?;
        Ok(AdmissionPolicy {
            match_conditions,
            variables,
            validations,
        })
    }

    /// Evaluates the policy for a request (`request` is the AdmissionRequest-shaped map
    /// with `operation`, `userInfo`, `resource`...; `object`/`old_object` are `Null`
    /// where the API server passes null: DELETE and CREATE respectively).
    pub fn evaluate(
        &self,
        request: &serde_json::Value,
        object: &serde_json::Value,
        old_object: &serde_json::Value,
    ) -> Decision {
        let mut ctx = Context::with_env(Arc::clone(environment()));
        let add = |ctx: &mut Context, name: &str, v: &serde_json::Value| -> Result<(), String> {
            ctx.add_variable_from_value(name, to_cel(v));
            Ok(())
        };
        let setup = add(&mut ctx, "request", request)
            .and_then(|_| add(&mut ctx, "object", object))
            .and_then(|_| add(&mut ctx, "oldObject", old_object));
        if let Err(e) = setup {
            return Decision::Denied {
                validation: 0,
                message: format!("cannot bind the admission variables: {e}"),
            };
        }
        for m in &self.match_conditions {
            // An error in a match condition fails closed, like failurePolicy: Fail.
            match m.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Decision::NotMatched,
                other => {
                    return Decision::Denied {
                        validation: 0,
                        message: format!("match condition: {other:?}"),
                    };
                }
            }
        }
        let mut vars = serde_json::Map::new();
        for (name, program) in &self.variables {
            // A variable that fails to evaluate is left out, so every validation that
            // uses it fails (as the API server fails them), and the others still run.
            if let Some(v) = program.execute(&ctx).ok().and_then(|v| v.json().ok()) {
                vars.insert(name.clone(), v);
            }
            ctx.add_variable_from_value(
                "variables",
                to_cel(&serde_json::Value::Object(vars.clone())),
            );
        }
        if self.variables.is_empty() {
            ctx.add_variable_from_value("variables", to_cel(&serde_json::Value::Object(vars)));
        }
        for (i, v) in self.validations.iter().enumerate() {
            match v.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let message = v
                        .message_expression
                        .as_ref()
                        .and_then(|m| match m.execute(&ctx) {
                            Ok(Value::String(s)) if !s.is_empty() => Some(s.to_string()),
                            _ => None,
                        })
                        .unwrap_or_else(|| v.message.clone());
                    return Decision::Denied {
                        validation: i,
                        message,
                    };
                }
                Ok(other) => {
                    return Decision::Denied {
                        validation: i,
                        message: format!("{}: not a bool: {other:?}", v.message),
                    };
                }
                Err(e) => {
                    return Decision::Denied {
                        validation: i,
                        message: format!("{}: evaluation error: {e}", v.message),
                    };
                }
            }
        }
        Decision::Allowed
    }
}

/// JSON as the API server's CEL sees an unstructured object: integers are `int`
/// (`uint` only beyond i64), other numbers `double`.
fn to_cel(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::Int(i),
            (None, Some(u), _) => Value::UInt(u),
            (_, _, Some(f)) => Value::Float(f),
            _ => Value::Null,
        },
        J::String(s) => Value::String(Arc::new(s.clone())),
        J::Array(a) => Value::List(Arc::new(a.iter().map(to_cel).collect())),
        J::Object(o) => Value::from(
            o.iter()
                .map(|(k, v)| (k.clone(), to_cel(v)))
                .collect::<std::collections::HashMap<String, Value>>(),
        ),
    }
}
