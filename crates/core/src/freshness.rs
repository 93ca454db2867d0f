//! How fresh a query's answer is, for every query the operator runs.
//!
//! A Prometheus instant query answers with the last sample of each series within its lookback
//! window (5 minutes by default): a series whose exporter stopped, or whose samples carry
//! their own old timestamps, goes on answering with an old value. `spec.metrics.staleAfter`
//! says how old a value may be; to apply it, every query returns, beside its values, the
//! timestamps of the samples they were computed from: series labelled
//! `bp_sample="timestamp"` ([`SAMPLE_LABEL`], [`SAMPLE_TIMESTAMP`]).
//!
//! `timestamp()` of a computed expression is the evaluation time, not the age of its inputs, so
//! the timestamps are taken on the vector selectors the query reads. [`with_freshness`]
//! parses a query, collects its selectors (a range selector `x[5m]` as the instant selector
//! `x`; `offset` and `@` are dropped, so that a query that reads the past on purpose is as fresh
//! as its series are now) and appends, with `or`:
//!
//! - per selector, the newest sample of each `(namespace, workload)` group its series fall
//!   into: `max by (namespace, workload) (timestamp(S))`. A selector whose series carry no
//!   `workload` label gives one timestamp per namespace, one without `namespace` either one
//!   for the whole query;
//! - the oldest of those across the selectors, per group: `min by (namespace, workload)`; a
//!   value is as fresh as the stalest series it is computed from;
//! - the oldest, across the selectors, of each selector's newest sample anywhere (labelled
//!   `bp_scope="query"`), which covers the values whose labels no selector's series carry
//!   (a query that relabels `namespace` or `workload` with `label_replace`).
//!
//! The operator ([`crate::tenancy::scoped_queries`], then the fold in the operator's
//! `observe::promql`) dates each value by the oldest timestamp series that applies to it: its
//! own `(namespace, workload)`, its namespace, and the whole query. A value with no timestamp
//! at all is unknown. Pure string and syntax-tree work; the rendering is parsed again and
//! checked to hold the query unchanged.

use promql_parser::parser::Expr;
use promql_parser::parser::value::ValueType;

use crate::tenancy::query::{
    self, MAX_NESTING, ScopeError, name_into_matcher, normalize, parse_bounded, sort_matchers, walk,
};

/// Label of the series that carry sample timestamps.
pub const SAMPLE_LABEL: &str = "bp_sample";
/// Value of [`SAMPLE_LABEL`] on a timestamp series.
pub const SAMPLE_TIMESTAMP: &str = "timestamp";
/// Label that keeps the selectors' timestamp series apart inside the appended expression
/// (aggregated away before the answer).
pub const SELECTOR_LABEL: &str = "bp_sel";
/// Label of the whole-query timestamp series (`bp_scope="query"`), which keeps it apart from a
/// per-group series without `namespace` and `workload`.
pub const SCOPE_LABEL: &str = "bp_scope";

/// The most distinct selectors a query may read (each is rendered twice more).
pub const MAX_SELECTORS: usize = 32;

/// The longest query [`with_freshness`] accepts: a tenant's query after scoping, a policy's,
/// or one built from a queue preset.
pub const MAX_INPUT_BYTES: usize = 4 * query::MAX_QUERY_BYTES;

/// `query` with the timestamp series of its selectors appended (see the [module](self)), or
/// why that cannot be done: it does not parse, reads no series (its freshness would be
/// unknowable), reads more than [`MAX_SELECTORS`] distinct selectors, or would not render
/// faithfully.
pub fn with_freshness(query: &str) -> Result<String, ScopeError> {
    let expr = parse_bounded(query, MAX_INPUT_BYTES, MAX_NESTING + 1)?;
    // `or` joins instant vectors only; a range vector is no value the operator can read either.
    if expr.value_type() == ValueType::Matrix {
        return Err(ScopeError::Unsupported(
            "a range vector as its result (an instant vector is needed)".into(),
        ));
    }
    let selectors = selectors(&expr)?;
    if selectors.is_empty() {
        return Err(ScopeError::NoSeries);
    }
    if selectors.len() > MAX_SELECTORS {
        return Err(ScopeError::Unsupported(format!(
            "more than {MAX_SELECTORS} distinct series selectors"
        )));
    }
    let mut value = expr;
    normalize(&mut value)?;
    let rendered = render(&value.to_string(), &selectors);
    // What Prometheus is sent, parsed again: the value part must be the query it was given.
    let mut reparsed = query::parse_unchecked(&rendered).map_err(|_| ScopeError::NotFaithful)?;
    normalize(&mut reparsed).map_err(|_| ScopeError::NotFaithful)?;
    if value_part(&reparsed) != Some(&value) {
        return Err(ScopeError::NotFaithful);
    }
    Ok(rendered)
}

/// The distinct selectors of `expr`, each rendered as an instant selector without `offset`
/// and `@`, its metric name as a quoted `__name__` matcher, in order of first appearance.
fn selectors(expr: &Expr) -> Result<Vec<String>, ScopeError> {
    let mut out: Vec<String> = Vec::new();
    let mut extension = false;
    walk(expr, &mut |e| {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            Expr::Extension(_) => {
                extension = true;
                return;
            }
            _ => return,
        };
        let mut vs = vs.clone();
        vs.offset = None;
        vs.at = None;
        name_into_matcher(&mut vs);
        sort_matchers(&mut vs.matchers);
        let text = Expr::VectorSelector(vs).to_string();
        if !out.contains(&text) {
            out.push(text);
        }
    });
    if extension {
        return Err(ScopeError::Unsupported("an extension node".into()));
    }
    Ok(out)
}

/// `(value) or <per group> or <whole query>` (see the [module](self)).
fn render(value: &str, selectors: &[String]) -> String {
    let per_selector = selectors
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                r#"label_replace(max by (namespace, workload) (timestamp({s})), "{SELECTOR_LABEL}", "{i}", "", "")"#
            )
        })
        .collect::<Vec<_>>()
        .join(" or ");
    format!(
        r#"({value}) or label_replace(min by (namespace, workload) ({per_selector}), "{SAMPLE_LABEL}", "{SAMPLE_TIMESTAMP}", "", "") or label_replace(label_replace(min(max by ({SELECTOR_LABEL}) ({per_selector})), "{SAMPLE_LABEL}", "{SAMPLE_TIMESTAMP}", "", ""), "{SCOPE_LABEL}", "query", "", "")"#
    )
}

/// The `value` of `(value) or A or B`.
fn value_part(expr: &Expr) -> Option<&Expr> {
    let Expr::Binary(outer) = expr else {
        return None;
    };
    let Expr::Binary(inner) = outer.lhs.as_ref() else {
        return None;
    };
    let Expr::Paren(p) = inner.lhs.as_ref() else {
        return None;
    };
    Some(&p.expr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use promql_parser::parser;

    fn fresh(q: &str) -> String {
        match with_freshness(q) {
            Ok(s) => s,
            Err(e) => panic!("{q}: {e}"),
        }
    }

    /// The selectors `timestamp()` is taken on in a rendered query.
    fn stamped(out: &str) -> Vec<String> {
        let expr = parser::parse(out).unwrap_or_else(|e| panic!("{out}: {e}"));
        let mut found = Vec::new();
        walk(&expr, &mut |e| {
            if let Expr::Call(c) = e
                && c.func.name == "timestamp"
            {
                found.push(c.args.args[0].to_string());
            }
        });
        found
    }

    #[test]
    fn a_custom_query_gets_the_timestamps_of_its_selectors() {
        let q = r#"sum by (namespace, workload) (rate(jobs_done_total{queue="a"}[2m]))"#;
        assert_eq!(
            fresh(q),
            concat!(
                r#"(sum by (namespace, workload) (rate({__name__="jobs_done_total",queue="a"}[2m]))) or "#,
                r#"label_replace(min by (namespace, workload) (label_replace(max by (namespace, workload) "#,
                r#"(timestamp({__name__="jobs_done_total",queue="a"})), "bp_sel", "0", "", "")), "#,
                r#""bp_sample", "timestamp", "", "") or label_replace(label_replace(min(max by (bp_sel) "#,
                r#"(label_replace(max by (namespace, workload) (timestamp({__name__="jobs_done_total",queue="a"})), "#,
                r#""bp_sel", "0", "", ""))), "bp_sample", "timestamp", "", ""), "bp_scope", "query", "", "")"#
            )
        );
    }

    #[test]
    fn every_distinct_selector_is_stamped_as_an_instant_selector_now() {
        let q = r#"max by (namespace, workload) (age{q="a"} offset 5m) / (sum(rate(done[1m] @ 100)) + sum(done) + max_over_time(age{q="a"}[10m:1m]))"#;
        let out = fresh(q);
        let s = stamped(&out);
        // Two distinct selectors, each stamped twice (per group and whole query).
        assert_eq!(s.len(), 4, "{out}");
        for want in [r#"{__name__="age",q="a"}"#, r#"{__name__="done"}"#] {
            assert_eq!(
                s.iter().filter(|x| *x == want).count(),
                2,
                "{want} in {out}"
            );
        }
        assert!(!s.iter().any(|x| x.contains("offset") || x.contains('@')));
    }

    #[test]
    fn the_value_part_is_the_query_unchanged() {
        for q in [
            "foo",
            r#"{"a.b"}"#,
            r#"label_replace(sum(x), "workload", "w", "", "") # a comment ) or vector(1)"#,
            r#"sum by (namespace, workload) (x{a="1" or b="2"})"#,
            "-foo > bool 0",
            r#"topk(1, foo) or on() bar"#,
        ] {
            let out = fresh(q);
            let reparsed = parser::parse(&out).unwrap();
            let mut want = parser::parse(q).unwrap();
            normalize(&mut want).unwrap();
            let mut got = value_part(&reparsed).unwrap().clone();
            normalize(&mut got).unwrap();
            assert_eq!(got, want, "{q} → {out}");
        }
    }

    #[test]
    fn queries_without_series_or_with_too_many_are_refused() {
        for q in ["vector(1)", "time()", "1", "scalar(vector(2)) * 3"] {
            assert_eq!(with_freshness(q), Err(ScopeError::NoSeries), "{q}");
        }
        let many = (0..=MAX_SELECTORS)
            .map(|i| format!("m{i}"))
            .collect::<Vec<_>>()
            .join(" + ");
        assert!(matches!(
            with_freshness(&many),
            Err(ScopeError::Unsupported(_))
        ));
        // The same selector many times is one.
        let same = vec!["m"; 2 * MAX_SELECTORS].join(" + ");
        assert_eq!(stamped(&fresh(&same)).len(), 2);
        assert!(matches!(with_freshness("sum("), Err(ScopeError::Parse(_))));
    }

    #[test]
    fn a_range_vector_result_is_refused_as_unsupported() {
        // Found by the tenancy fuzz test (`:[1]`): `(x[1s]) or …` does not parse.
        for q in [":[1]", r#"jobs{namespace="a"}[5m]"#, "(m[1m])", "m[5m:1m]"] {
            assert!(
                matches!(with_freshness(q), Err(ScopeError::Unsupported(_))),
                "{q}: {:?}",
                with_freshness(q)
            );
        }
    }

    #[test]
    fn a_scoped_query_stays_scoped() {
        let q = crate::tenancy::query::scope_to_namespace(
            r#"label_replace(max(age{namespace="other"}), "namespace", "a", "", "")"#,
            "a",
        )
        .unwrap();
        let out = fresh(&q);
        assert!(crate::tenancy::query::is_scoped_to(
            &parser::parse(&out).unwrap(),
            "a"
        ));
    }
}
