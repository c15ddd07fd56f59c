//! The runtime cost bound of selector evaluation, standing in for the API server's and
//! the scheduler's CEL cost limit (`CELSelectorExpressionMaxCost`, 1,000,000): an
//! expression whose evaluation goes past [`MAX_COST`] stops with "operation cancelled:
//! actual cost limit exceeded", as cel-go's runtime cost tracker says it.
//!
//! The `cel` crate has no cost tracker, so a compiled expression is rewritten once
//! ([`instrument`]): the operands and the result of every function call, every list and
//! map element and every loop-step operand of a comprehension pass through
//! [`CHARGE`], an identity function that charges 1 plus the value's size (characters of
//! a string, bytes, elements of a list or map) to a per-thread meter. Every iteration of
//! a comprehension thus costs at least 1, and a value that grows (string or list
//! concatenation, `replace`) costs its size each time it is used, so neither nested
//! comprehensions nor repeated doubling can run long or allocate much before the meter
//! stops them. `lists.range(n)` is charged `n` before it allocates, and `replace` its
//! largest possible result.
//!
//! The units are not cel-go's (whose costs differ per function), so the limit is the
//! same number but not the same boundary; what matters is that evaluation always ends,
//! within a bounded time and memory. Loop steps keep their shape (`@result && pred`,
//! `@result + [item]`), so the interpreter's error-absorbing folds and in-place appends
//! still apply.

use std::cell::Cell;

use cel::ExecutionError;
use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, ListExpr, MapExpr,
    operators,
};
use cel::common::types::{CelInt, CelString};
use cel::common::value::CowVal;

/// The cost limit of one evaluation (`CELSelectorExpressionMaxCost`).
pub const MAX_COST: u64 = 1_000_000;

/// The identity function that charges its argument's size.
pub(crate) const CHARGE: &str = "@tessera_cost";
/// `lists.range(n)`'s argument, charged `n` before the list is built.
pub(crate) const CHARGE_COUNT: &str = "@tessera_cost_count";
/// `s.replace(old, new[, n])`, charged its largest possible result before it is built.
pub(crate) const REPLACE: &str = "@tessera_replace";

/// The message of the error that stops an evaluation, as cel-go words it.
pub const COST_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

thread_local! {
    /// Cost spent by the evaluation running on this thread, and its limit.
    static METER: Cell<(u64, u64)> = const { Cell::new((0, u64::MAX)) };
}

/// Starts metering an evaluation on this thread with `limit`.
pub(crate) fn start(limit: u64) {
    METER.with(|m| m.set((0, limit)));
}

/// Ends metering; whether the limit was exceeded at any point (an error an `||` or an
/// `all()` absorbed still counts).
pub(crate) fn finish() -> bool {
    METER.with(|m| {
        let (spent, limit) = m.get();
        m.set((0, u64::MAX));
        spent > limit
    })
}

fn charge(amount: u64) -> Result<(), ExecutionError> {
    METER.with(|m| {
        let (spent, limit) = m.get();
        let spent = spent.saturating_add(amount);
        m.set((spent, limit));
        if spent > limit {
            Err(ExecutionError::function_error("cost", COST_EXCEEDED))
        } else {
            Ok(())
        }
    })
}

fn size_of(v: &CowVal<'_, '_>) -> u64 {
    v.as_sizer()
        .map_or(0, |s| u64::try_from(*s.size().inner()).unwrap_or(0))
}

fn one<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let len = args.len();
    let [v]: [CowVal<'b, 'v>; 1] = args
        .try_into()
        .map_err(|_| ExecutionError::invalid_argument_count(1, len))?;
    Ok(v)
}

/// [`CHARGE`]: charges 1 + the size of its argument and returns it.
pub(crate) fn charge_value<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let v = one(args)?;
    charge(1 + size_of(&v))?;
    Ok(v)
}

/// [`CHARGE_COUNT`]: charges an int argument's value (a count about to be allocated).
pub(crate) fn charge_count<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let v = one(args)?;
    let n = v
        .downcast_ref::<CelInt>()
        .map_or(0, |i| u64::try_from(*i.inner()).unwrap_or(0));
    charge(1 + n)?;
    Ok(v)
}

/// [`REPLACE`]: `s.replace(old, new)` or `s.replace(old, new, n)` (cel-go's strings
/// extension: `n < 0` replaces all), charged its largest possible result first.
pub(crate) fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let strs: Vec<&str> = args
        .iter()
        .take(3)
        .filter_map(|a| a.downcast_ref::<CelString>().map(|s| s.inner()))
        .collect();
    let [s, old, new] = strs.as_slice() else {
        return Err(ExecutionError::function_error(
            "replace",
            "replace takes (string, string, string[, int])",
        ));
    };
    let n = match args.get(3) {
        None => -1,
        Some(v) => *v
            .downcast_ref::<CelInt>()
            .ok_or_else(|| ExecutionError::function_error("replace", "count must be an int"))?
            .inner(),
    };
    if args.len() > 4 {
        return Err(ExecutionError::invalid_argument_count(4, args.len()));
    }
    // At most one replacement per character boundary (an empty `old` matches at each).
    let slots = s.chars().count() as u64 + 1;
    let slots = if n >= 0 { slots.min(n as u64) } else { slots };
    charge((s.len() as u64).saturating_add(slots.saturating_mul(new.len() as u64 + 1)))?;
    let out = if n < 0 {
        s.replace(old, new)
    } else {
        s.replacen(old, new, usize::try_from(n).unwrap_or(usize::MAX))
    };
    Ok(CowVal::owned(CelString::from(out)))
}

fn node(expr: Expr) -> IdedExpr {
    IdedExpr { id: 0, expr }
}

fn call(func: &str, args: Vec<IdedExpr>) -> IdedExpr {
    node(Expr::Call(CallExpr {
        func_name: func.to_owned(),
        target: None,
        args,
    }))
}

fn charged(e: IdedExpr) -> IdedExpr {
    call(CHARGE, vec![e])
}

/// The expression with every call's operands and result, every list and map element
/// and every loop step's operands charged to the meter (see the module documentation).
pub(crate) fn instrument(e: &IdedExpr) -> IdedExpr {
    match &e.expr {
        Expr::Call(c) => charged(instrument_call(c)),
        Expr::List(l) => node(Expr::List(ListExpr {
            elements: l.elements.iter().map(|x| charged(instrument(x))).collect(),
            optional_indices: l.optional_indices.clone(),
        })),
        Expr::Map(m) => node(Expr::Map(MapExpr {
            entries: m.entries.iter().map(instrument_entry).collect(),
        })),
        Expr::Select(s) => {
            let mut s = s.clone();
            *s.operand = instrument(&s.operand);
            IdedExpr {
                id: e.id,
                expr: Expr::Select(s),
            }
        }
        Expr::Struct(s) => {
            let mut s = s.clone();
            s.entries = s.entries.iter().map(instrument_entry).collect();
            IdedExpr {
                id: e.id,
                expr: Expr::Struct(s),
            }
        }
        Expr::Comprehension(c) => IdedExpr {
            id: e.id,
            expr: Expr::Comprehension(Box::new(ComprehensionExpr {
                iter_range: charged(instrument(&c.iter_range)),
                iter_var: c.iter_var.clone(),
                iter_var2: c.iter_var2.clone(),
                accu_var: c.accu_var.clone(),
                accu_init: charged(instrument(&c.accu_init)),
                // A literal condition keeps the in-place append of `map`/`filter`.
                loop_cond: match c.loop_cond.expr {
                    Expr::Literal(_) => c.loop_cond.clone(),
                    _ => charged(instrument(&c.loop_cond)),
                },
                loop_step: instrument_step(&c.loop_step, &c.accu_var),
                result: instrument(&c.result),
            })),
        },
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => e.clone(),
    }
}

fn instrument_entry(entry: &IdedEntryExpr) -> IdedEntryExpr {
    let expr = match &entry.expr {
        EntryExpr::MapEntry(m) => {
            let mut m = m.clone();
            m.key = charged(instrument(&m.key));
            m.value = charged(instrument(&m.value));
            EntryExpr::MapEntry(m)
        }
        EntryExpr::StructField(f) => {
            let mut f = f.clone();
            f.value = charged(instrument(&f.value));
            EntryExpr::StructField(f)
        }
    };
    IdedEntryExpr { id: entry.id, expr }
}

/// Whether `e` is a (possibly qualified) name, such as the `lists` of `lists.range(n)`:
/// it may name a function namespace rather than a value, so it is left as written.
fn is_name(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Ident(_) => true,
        Expr::Select(s) => !s.test && is_name(&s.operand),
        _ => false,
    }
}

fn instrument_call(c: &CallExpr) -> IdedExpr {
    let target = c.target.as_ref().map(|t| {
        if is_name(t) {
            (**t).clone()
        } else {
            charged(instrument(t))
        }
    });
    let args: Vec<IdedExpr> = c.args.iter().map(|a| charged(instrument(a))).collect();
    let is_lists = |t: &Option<IdedExpr>| matches!(t, Some(IdedExpr { expr: Expr::Ident(n), .. }) if n == "lists");
    match (c.func_name.as_str(), target) {
        ("range", t) if is_lists(&t) => node(Expr::Call(CallExpr {
            func_name: c.func_name.clone(),
            target: t.map(Box::new),
            args: args
                .into_iter()
                .map(|a| call(CHARGE_COUNT, vec![a]))
                .collect(),
        })),
        ("lists.range", None) => call(
            "lists.range",
            args.into_iter()
                .map(|a| call(CHARGE_COUNT, vec![a]))
                .collect(),
        ),
        ("replace", Some(t)) if (2..=3).contains(&args.len()) => {
            let mut all = vec![t];
            all.extend(args);
            call(REPLACE, all)
        }
        (_, target) => node(Expr::Call(CallExpr {
            func_name: c.func_name.clone(),
            target: target.map(Box::new),
            args,
        })),
    }
}

/// A loop step keeps its top-level shape (`@result && pred`, `@result + [x]`,
/// `cond ? @result + [x] : @result`): the interpreter recognises it. Its other
/// operands are charged, so each iteration costs at least 1.
fn instrument_step(e: &IdedExpr, accu: &str) -> IdedExpr {
    let Expr::Call(c) = &e.expr else {
        return charged(instrument(e));
    };
    let shaped = c.target.is_none()
        && matches!(
            c.func_name.as_str(),
            operators::LOGICAL_AND
                | operators::LOGICAL_OR
                | operators::ADD
                | operators::CONDITIONAL
        );
    if !shaped {
        return charged(instrument(e));
    }
    let args = c
        .args
        .iter()
        .map(|a| match &a.expr {
            Expr::Ident(name) if name == accu => a.clone(),
            Expr::Call(_) if c.func_name == operators::CONDITIONAL => instrument_step(a, accu),
            _ => charged(instrument(a)),
        })
        .collect();
    IdedExpr {
        id: e.id,
        expr: Expr::Call(CallExpr {
            func_name: c.func_name.clone(),
            target: None,
            args,
        }),
    }
}
