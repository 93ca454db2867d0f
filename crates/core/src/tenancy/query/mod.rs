//! Scoping a tenant's PromQL to its own namespace.
//!
//! `spec.metrics.queries` are tenant input that the operator runs with its own credentials on a
//! Prometheus that holds every namespace's series. Run verbatim, a query in namespace A can
//! read namespace B's series and relabel them as A's (`label_replace(b_series, "namespace",
//! "A", ...)`), and B's queue depth then shows in A's `status.fleet`. [`scope_to_namespace`]
//! does what prom-label-proxy does: it parses the query into an AST, puts
//! `namespace="<namespace>"` on every vector and matrix selector (replacing any `namespace`
//! matcher the tenant wrote, in every `or` group of a selector) and renders the AST back.
//!
//! The rendering is checked, not trusted: the output is parsed again and accepted only if it is
//! the same AST and every selector in it carries exactly the namespace matcher. Selectors are
//! rendered with the metric name as a quoted `__name__` matcher, so that no name the parser
//! accepted (a quoted UTF-8 name can hold any character) is ever printed raw. A query that
//! reads no series at all (`vector(100)`) is rejected as well: its numbers would be made up, and
//! they would scale a workload.

use promql_parser::label::{MatchOp, Matcher, Matchers};
use promql_parser::parser::{self, Expr, VectorSelector};

/// The label every selector of a tenant's query is restricted to.
pub const NAMESPACE_LABEL: &str = "namespace";

/// The longest query accepted (the CRD's `maxLength` for each query string).
pub const MAX_QUERY_BYTES: usize = 4096;

/// The deepest nesting of brackets accepted: the parser, the AST's drop and its rendering all
/// recurse, and no useful query nests this deep.
pub const MAX_NESTING: usize = 64;

const METRIC_NAME: &str = "__name__";

/// Functions a tenant's query may not call: `info()` joins labels of series it selects by
/// identity (`instance`, `job`), not by namespace.
const REFUSED_FUNCTIONS: [&str; 1] = ["info"];

/// Why a query was rejected. Every message is safe to show to the tenant (it repeats nothing
/// but the tenant's own input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// Longer than allowed ([`MAX_QUERY_BYTES`] for a tenant's query).
    #[error("the query is {len} bytes long, more than the {max} allowed")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Brackets nested deeper than [`MAX_NESTING`].
    #[error("the query nests brackets more than {MAX_NESTING} deep")]
    TooDeep,
    /// Not PromQL.
    #[error("the query does not parse as PromQL: {0}")]
    Parse(String),
    /// Reads no series (`vector(1)`, `time()`, a number).
    #[error(
        "the query reads no series (a number, `vector()` or `time()` alone): its values would be made up"
    )]
    NoSeries,
    /// Uses something that cannot be scoped to a namespace.
    #[error("the query uses {0}, which cannot be restricted to one namespace")]
    Unsupported(String),
    /// The rewritten query does not parse back into the rewritten AST (a construct the
    /// renderer cannot express faithfully); it is not run rather than run differently.
    #[error("the query cannot be rewritten faithfully with the namespace matcher")]
    NotFaithful,
}

/// Rewrites `query` so that every selector reads only the series of `namespace`, or says why it
/// cannot. The output parses back (with the same parser) into an AST whose every selector has
/// exactly one `namespace` matcher, `namespace="<namespace>"`, in every `or` group.
pub fn scope_to_namespace(query: &str, namespace: &str) -> Result<String, ScopeError> {
    let mut expr = parse_checked(query)?;
    let mut selectors = 0usize;
    inject(&mut expr, namespace, &mut selectors)?;
    if selectors == 0 {
        return Err(ScopeError::NoSeries);
    }
    let rendered = expr.to_string();
    // The check that matters: what Prometheus will be sent, parsed again.
    // (The rendered selectors add one level of braces.)
    let mut reparsed =
        parse_within(&rendered, MAX_NESTING + 1).map_err(|_| ScopeError::NotFaithful)?;
    normalize(&mut reparsed)?;
    if reparsed != expr || !is_scoped_to(&reparsed, namespace) {
        return Err(ScopeError::NotFaithful);
    }
    Ok(rendered)
}

/// Whether every selector in `expr` carries exactly one `namespace` matcher, an equality with
/// `namespace`, in every `or` group, and `expr` has at least one selector. The property the
/// rewrite guarantees, for its own check and for tests.
pub fn is_scoped_to(expr: &Expr, namespace: &str) -> bool {
    let mut ok = true;
    let mut selectors = 0usize;
    walk(expr, &mut |e| {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return,
        };
        selectors += 1;
        ok &= selector_scoped_to(vs, namespace);
    });
    ok && selectors > 0
}

/// Parses `query` after the length and nesting checks.
pub fn parse_checked(query: &str) -> Result<Expr, ScopeError> {
    parse_within(query, MAX_NESTING)
}

fn parse_within(query: &str, max_nesting: usize) -> Result<Expr, ScopeError> {
    parse_bounded(query, MAX_QUERY_BYTES, max_nesting)
}

/// Parses an output of the operator's own rewriting (no length limit, a little more nesting
/// than a tenant may write).
pub(crate) fn parse_unchecked(query: &str) -> Result<Expr, ScopeError> {
    parse_bounded(query, usize::MAX, MAX_NESTING + 8)
}

/// Parses `query` if it is at most `max_bytes` long and nests brackets at most `max_nesting`
/// deep; a parser panic is a rejection.
pub(crate) fn parse_bounded(
    query: &str,
    max_bytes: usize,
    max_nesting: usize,
) -> Result<Expr, ScopeError> {
    if query.len() > max_bytes {
        return Err(ScopeError::TooLong {
            len: query.len(),
            max: max_bytes,
        });
    }
    if nesting(query) > max_nesting {
        return Err(ScopeError::TooDeep);
    }
    // A parser bug must not take the operator down with it: a panic is a rejection.
    std::panic::catch_unwind(|| parser::parse(query))
        .unwrap_or_else(|_| Err("the parser failed on this input".to_owned()))
        .map_err(ScopeError::Parse)
}

fn selector_scoped_to(vs: &VectorSelector, namespace: &str) -> bool {
    let groups: Vec<&Vec<Matcher>> = if vs.matchers.or_matchers.is_empty() {
        vec![&vs.matchers.matchers]
    } else {
        // The parser moves plain matchers into the `or` groups; any left outside would be
        // printed by nobody, so they must not exist.
        if !vs.matchers.matchers.is_empty() {
            return false;
        }
        vs.matchers.or_matchers.iter().collect()
    };
    groups.iter().all(|group| {
        let mut ns = group.iter().filter(|m| m.name == NAMESPACE_LABEL);
        matches!(
            (ns.next(), ns.next()),
            (Some(m), None) if m.op == MatchOp::Equal && m.value == namespace
        )
    })
}

/// Visits every node of `expr`, children included (aggregation parameters and function
/// arguments too), depth first.
pub(crate) fn walk(expr: &Expr, f: &mut impl FnMut(&Expr)) {
    f(expr);
    match expr {
        Expr::Aggregate(a) => {
            if let Some(p) = &a.param {
                walk(p, f);
            }
            walk(&a.expr, f);
        }
        Expr::Unary(u) => walk(&u.expr, f),
        Expr::Binary(b) => {
            walk(&b.lhs, f);
            walk(&b.rhs, f);
        }
        Expr::Paren(p) => walk(&p.expr, f),
        Expr::Subquery(s) => walk(&s.expr, f),
        Expr::Call(c) => {
            for a in &c.args.args {
                walk(a, f);
            }
        }
        Expr::NumberLiteral(_)
        | Expr::StringLiteral(_)
        | Expr::VectorSelector(_)
        | Expr::MatrixSelector(_)
        | Expr::Extension(_) => {}
    }
}

/// Puts the namespace matcher on every selector of `expr` (counting them in `selectors`) and
/// moves each metric name into a `__name__` matcher.
fn inject(expr: &mut Expr, namespace: &str, selectors: &mut usize) -> Result<(), ScopeError> {
    match expr {
        Expr::VectorSelector(vs) => {
            *selectors += 1;
            scope_selector(vs, namespace);
        }
        Expr::MatrixSelector(ms) => {
            *selectors += 1;
            scope_selector(&mut ms.vs, namespace);
        }
        Expr::Aggregate(a) => {
            if let Some(p) = &mut a.param {
                inject(p, namespace, selectors)?;
            }
            inject(&mut a.expr, namespace, selectors)?;
        }
        Expr::Unary(u) => inject(&mut u.expr, namespace, selectors)?,
        Expr::Binary(b) => {
            inject(&mut b.lhs, namespace, selectors)?;
            inject(&mut b.rhs, namespace, selectors)?;
        }
        Expr::Paren(p) => inject(&mut p.expr, namespace, selectors)?,
        Expr::Subquery(s) => inject(&mut s.expr, namespace, selectors)?,
        Expr::Call(c) => {
            if REFUSED_FUNCTIONS.contains(&c.func.name) {
                return Err(ScopeError::Unsupported(format!("{}()", c.func.name)));
            }
            for a in &mut c.args.args {
                inject(a, namespace, selectors)?;
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        Expr::Extension(_) => return Err(ScopeError::Unsupported("an extension node".into())),
    }
    Ok(())
}

/// Replaces every `namespace` matcher of `vs` by `namespace="<namespace>"`, in each `or` group.
fn scope_selector(vs: &mut VectorSelector, namespace: &str) {
    name_into_matcher(vs);
    let scope = || Matcher::new(MatchOp::Equal, NAMESPACE_LABEL, namespace);
    let m = &mut vs.matchers;
    if m.or_matchers.is_empty() {
        m.matchers.retain(|x| x.name != NAMESPACE_LABEL);
        m.matchers.push(scope());
    } else {
        // Plain matchers beside `or` groups belong to every group.
        let common = std::mem::take(&mut m.matchers);
        for group in &mut m.or_matchers {
            group.extend(common.iter().cloned());
            group.retain(|x| x.name != NAMESPACE_LABEL);
            group.push(scope());
        }
    }
    sort_matchers(&mut vs.matchers);
}

/// Moves `foo` of `foo{...}` into the matchers as `__name__="foo"` (into each `or` group), so
/// that the name is rendered quoted and escaped like any label value.
pub(crate) fn name_into_matcher(vs: &mut VectorSelector) {
    let Some(name) = vs.name.take() else { return };
    let m = Matcher::new(MatchOp::Equal, METRIC_NAME, &name);
    if vs.matchers.or_matchers.is_empty() {
        vs.matchers.matchers.push(m);
    } else {
        for group in &mut vs.matchers.or_matchers {
            group.push(m.clone());
        }
    }
}

/// The renderer sorts plain matchers; sort ours the same way so that a re-parse compares equal.
pub(crate) fn sort_matchers(m: &mut Matchers) {
    m.matchers.sort_by_key(|x| x.to_string());
}

/// Brings a re-parsed AST into the form [`inject`] leaves (names as matchers, sorted), without
/// adding any namespace matcher, so that it can be compared with the rewritten AST.
pub(crate) fn normalize(expr: &mut Expr) -> Result<(), ScopeError> {
    match expr {
        Expr::VectorSelector(vs) => {
            name_into_matcher(vs);
            sort_matchers(&mut vs.matchers);
        }
        Expr::MatrixSelector(ms) => {
            name_into_matcher(&mut ms.vs);
            sort_matchers(&mut ms.vs.matchers);
        }
        Expr::Aggregate(a) => {
            if let Some(p) = &mut a.param {
                normalize(p)?;
            }
            normalize(&mut a.expr)?;
        }
        Expr::Unary(u) => normalize(&mut u.expr)?,
        Expr::Binary(b) => {
            normalize(&mut b.lhs)?;
            normalize(&mut b.rhs)?;
        }
        Expr::Paren(p) => normalize(&mut p.expr)?,
        Expr::Subquery(s) => normalize(&mut s.expr)?,
        Expr::Call(c) => {
            for a in &mut c.args.args {
                normalize(a)?;
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        Expr::Extension(_) => return Err(ScopeError::Unsupported("an extension node".into())),
    }
    Ok(())
}

/// The deepest nesting of `(`, `[` and `{` outside string literals and comments (PromQL strings
/// are `"..."` and `'...'` with backslash escapes, and raw `` `...` ``; a comment runs from `#`
/// to the end of the line). Unbalanced input is left to the parser.
fn nesting(query: &str) -> usize {
    let mut depth = 0usize;
    let mut max = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    for c in query.chars() {
        if comment {
            comment = c != '\n';
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '#' => comment = true,
            '(' | '[' | '{' => {
                depth += 1;
                max = max.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests;
