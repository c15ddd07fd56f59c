//! The Kubernetes quantity library of CEL (`k8s.io/apiserver/pkg/cel/library/quantity.go`):
//! `quantity()`, `isQuantity()` and the functions on `kubernetes.Quantity` values. Values
//! are exact, backed by [`crate::validation::quantity`]; everything here is pure.
//!
//! Quantities have no operators but `==` and `!=` (by value, so
//! `quantity("1Gi") == quantity("1024Mi")`): `<` and friends are a "no matching
//! overload" error, as in Kubernetes. `mul`, `div` and `divInt` (newer library
//! versions) are not provided.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::types::{CelBool, CelDouble, CelInt, CelString, Kind, Type};
use cel::common::value::{StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use crate::validation::quantity::{ParsedQuantity, Quantity};

/// The CEL type of quantities, named as in Kubernetes.
pub(crate) static QUANTITY_TYPE: Type = Type::simple_type(Kind::Opaque, "kubernetes.Quantity");

/// A `kubernetes.Quantity` CEL value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuantityVal(pub(crate) ParsedQuantity);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    /// Equal by value, like Go's `Quantity.Equal`: `1Gi == 1024Mi`.
    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|other| other.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityVal {}

/// Registers the library on `env`. Errors: a name or id already declared (a bug).
pub(crate) fn library(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn quantity: (CelString) -> Result<QuantityVal>,
        id = "string_to_quantity")?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool, id = "is_quantity_string")?;
    cel::add_overload!(env, fn sign: (QuantityVal) -> CelInt, id = "quantity_sign")?;
    // Kubernetes declares `sign` as a global function only; `q.sign()` is accepted too.
    cel::add_member_overload!(env, fn sign: (QuantityVal) -> CelInt,
        id = "quantity_sign_member")?;
    cel::add_member_overload!(env, fn is_greater_than: (QuantityVal, QuantityVal) -> CelBool,
        id = "quantity_is_greater_than")?;
    cel::add_member_overload!(env, fn is_less_than: (QuantityVal, QuantityVal) -> CelBool,
        id = "quantity_is_less_than")?;
    cel::add_member_overload!(env, fn compare_to: (QuantityVal, QuantityVal) -> CelInt,
        id = "quantity_compare_to")?;
    cel::add_member_overload!(env, fn as_approximate_float: (QuantityVal) -> CelDouble,
        id = "quantity_get_float")?;
    cel::add_member_overload!(env, fn as_integer: (QuantityVal) -> Result<CelInt>,
        id = "quantity_get_int")?;
    cel::add_member_overload!(env, fn is_integer: (QuantityVal) -> CelBool,
        id = "quantity_is_integer")?;
    cel::add_member_overload!(env, fn add: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        id = "quantity_add")?;
    cel::add_member_overload!(env, fn add_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "add", id = "quantity_add_int")?;
    cel::add_member_overload!(env, fn sub: (QuantityVal, QuantityVal) -> Result<QuantityVal>,
        id = "quantity_sub")?;
    cel::add_member_overload!(env, fn sub_int: (QuantityVal, CelInt) -> Result<QuantityVal>,
        name = "sub", id = "quantity_sub_int")?;
    Ok(())
}

/// `-1`, `0` or `1`, as Go's `Cmp`.
pub(crate) fn ordering_to_int(ordering: Ordering) -> CelInt {
    CelInt::from(match ordering {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })
}

/// `quantity(s)`: errors with Go's `ParseQuantity` message.
fn quantity(s: &CelString<'_>) -> Result<QuantityVal, ExecutionError> {
    Quantity::parse(s.inner())
        .map(QuantityVal)
        .map_err(|e| ExecutionError::function_error("quantity", e.go_message()))
}

fn is_quantity(s: &CelString<'_>) -> CelBool {
    CelBool::from(Quantity::parse(s.inner()).is_ok())
}

fn sign(this: &QuantityVal) -> CelInt {
    CelInt::from(i64::from(this.0.sign()))
}

fn is_greater_than(this: &QuantityVal, other: &QuantityVal) -> CelBool {
    CelBool::from(this.0 > other.0)
}

fn is_less_than(this: &QuantityVal, other: &QuantityVal) -> CelBool {
    CelBool::from(this.0 < other.0)
}

fn compare_to(this: &QuantityVal, other: &QuantityVal) -> CelInt {
    ordering_to_int(this.0.cmp(&other.0))
}

/// The nearest `f64` of the exact value (±inf beyond the range), like Go's
/// `AsApproximateFloat64`.
fn as_approximate_float(this: &QuantityVal) -> CelDouble {
    CelDouble::from(
        this.0
            .to_decimal_string()
            .parse::<f64>()
            .unwrap_or(f64::NAN),
    )
}

/// Go's `AsInt64`: the value if it is an integer that fits `i64`.
fn exact_i64(q: &ParsedQuantity) -> Option<i64> {
    if q.is_integer() {
        q.to_i64_value()
    } else {
        None
    }
}

fn as_integer(this: &QuantityVal) -> Result<CelInt, ExecutionError> {
    exact_i64(&this.0).map(CelInt::from).ok_or_else(|| {
        ExecutionError::function_error("asInteger", "cannot convert value to integer")
    })
}

fn is_integer(this: &QuantityVal) -> CelBool {
    CelBool::from(exact_i64(&this.0).is_some())
}

/// Go's `Add`/`Sub` never overflow (they fall back to arbitrary precision); the exact
/// parser is limited to 38 significant digits, so sums beyond that are an error here.
fn out_of_range(function: &str) -> ExecutionError {
    ExecutionError::function_error(function, "quantity out of the supported range")
}

fn add(this: &QuantityVal, other: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    this.0
        .checked_add(&other.0)
        .map(QuantityVal)
        .ok_or_else(|| out_of_range("add"))
}

fn add_int(this: &QuantityVal, other: &CelInt) -> Result<QuantityVal, ExecutionError> {
    add(this, &QuantityVal(ParsedQuantity::from_i64(*other.inner())))
}

fn sub(this: &QuantityVal, other: &QuantityVal) -> Result<QuantityVal, ExecutionError> {
    this.0
        .checked_sub(&other.0)
        .map(QuantityVal)
        .ok_or_else(|| out_of_range("sub"))
}

fn sub_int(this: &QuantityVal, other: &CelInt) -> Result<QuantityVal, ExecutionError> {
    sub(this, &QuantityVal(ParsedQuantity::from_i64(*other.inner())))
}

#[cfg(test)]
mod tests {
    use super::super::env::eval_standalone;
    use cel::Value;

    /// The examples of `quantity.go`'s documentation and tests evaluate as in Kubernetes.
    #[test]
    fn kubernetes_library_examples_hold() {
        let cases: &[(&str, Value)] = &[
            (
                r#"quantity("200M").compareTo(quantity("0.2G"))"#,
                Value::Int(0),
            ),
            (
                r#"quantity("50M").compareTo(quantity("50Mi"))"#,
                Value::Int(-1),
            ),
            (
                r#"quantity("50Mi").compareTo(quantity("50M"))"#,
                Value::Int(1),
            ),
            (
                r#"quantity("150Mi").isGreaterThan(quantity("100Mi"))"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50Mi").isGreaterThan(quantity("100Mi"))"#,
                Value::Bool(false),
            ),
            (
                r#"quantity("50M").isLessThan(quantity("100M"))"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("100M").isLessThan(quantity("50M"))"#,
                Value::Bool(false),
            ),
            (
                r#"quantity("50k").add(quantity("20")) == quantity("50.02k")"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50k").add(20) == quantity("50020")"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50k").sub(quantity("20")) == quantity("49.98k")"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50k").sub(20000) == quantity("30k")"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")"#,
                Value::Bool(true),
            ),
            (
                r#"quantity("50k").add(20).sub(quantity("100k")).asInteger()"#,
                Value::Int(-49980),
            ),
            (r#"quantity("50k").asInteger()"#, Value::Int(50000)),
            (r#"quantity("50000000G").isInteger()"#, Value::Bool(true)),
            (
                r#"quantity("9999999999999999999999999999999999999G").isInteger()"#,
                Value::Bool(false),
            ),
            (r#"quantity("1500m").isInteger()"#, Value::Bool(false)),
            (
                r#"quantity("50.703k").asApproximateFloat()"#,
                Value::Float(50703.0),
            ),
            (
                r#"quantity("50k").sub(20000).asApproximateFloat() == 30000.0"#,
                Value::Bool(true),
            ),
            (r#"sign(quantity("-1m"))"#, Value::Int(-1)),
            (r#"quantity("0").sign()"#, Value::Int(0)),
            (r#"quantity("3Ki").sign()"#, Value::Int(1)),
            (r#"isQuantity("1.3Gi")"#, Value::Bool(true)),
            (r#"isQuantity("10000k")"#, Value::Bool(true)),
            (r#"isQuantity("1,3G")"#, Value::Bool(false)),
            (r#"isQuantity("200K")"#, Value::Bool(false)),
            (r#"isQuantity("Three")"#, Value::Bool(false)),
            (r#"isQuantity("Mi")"#, Value::Bool(false)),
            (r#"quantity("2M") == quantity("0.002G")"#, Value::Bool(true)),
            (
                r#"quantity("200M") == quantity("0.3G")"#,
                Value::Bool(false),
            ),
            (r#"quantity("200M") != quantity("0.3G")"#, Value::Bool(true)),
        ];
        for (expression, want) in cases {
            assert_eq!(
                eval_standalone(expression).as_ref(),
                Ok(want),
                "{expression}"
            );
        }
    }

    /// Invalid quantities and lossy conversions are runtime errors with Go's messages.
    #[test]
    fn invalid_input_is_an_error_with_gos_message() {
        let cases = [
            (
                r#"quantity("10Mo")"#,
                "quantities must match the regular expression",
            ),
            (r#"quantity("10Mm")"#, "unable to parse quantity's suffix"),
            (r#"quantity("200K")"#, "unable to parse quantity's suffix"),
            (
                r#"quantity("9999999999999999999999999999999999999G").asInteger()"#,
                "cannot convert value to integer",
            ),
            (
                r#"quantity("1.5").asInteger()"#,
                "cannot convert value to integer",
            ),
            (
                r#"quantity("1") < quantity("2")"#,
                "no matching overload for '_<_'",
            ),
            (r#"quantity("1").isLessThan(2)"#, "no matching overload"),
        ];
        for (expression, want) in cases {
            let err = eval_standalone(expression).expect_err(expression);
            assert!(err.contains(want), "{expression}: {err}");
        }
    }
}
