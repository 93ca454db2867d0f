use super::*;

fn scoped(q: &str) -> String {
    match scope_to_namespace(q, "team-a") {
        Ok(s) => s,
        Err(e) => panic!("{q}: {e}"),
    }
}

/// Every selector of `out` (re-parsed) is scoped to `ns`, and it has as many selectors as `q`.
fn assert_scoped(q: &str, out: &str, ns: &str) {
    let reparsed = match parser::parse(out) {
        Ok(e) => e,
        Err(e) => panic!("{q} → {out} does not parse: {e}"),
    };
    assert!(is_scoped_to(&reparsed, ns), "{q} → {out}");
    let count = |e: &Expr| {
        let mut n = 0;
        walk(e, &mut |x| {
            n += usize::from(matches!(
                x,
                Expr::VectorSelector(_) | Expr::MatrixSelector(_)
            ))
        });
        n
    };
    let original = parser::parse(q).map(|e| count(&e)).unwrap_or(0);
    assert_eq!(
        count(&reparsed),
        original,
        "{q} → {out}: a selector went missing"
    );
}

#[test]
fn every_selector_gets_the_namespace_and_foreign_matchers_go() {
    let cases = [
        ("foo", r#"{__name__="foo",namespace="team-a"}"#),
        (
            r#"foo{namespace="team-b"}"#,
            r#"{__name__="foo",namespace="team-a"}"#,
        ),
        (
            r#"foo{namespace=~".+", namespace!="team-a", "namespace"="x"}"#,
            r#"{__name__="foo",namespace="team-a"}"#,
        ),
        (
            r#"{namespace="team-b" or workload="w"}"#,
            r#"{namespace="team-a" or workload="w", namespace="team-a"}"#,
        ),
        (
            r#"sum by (namespace, workload) (rate(backpressure_queue_arrivals_total[1m]))"#,
            r#"sum by (namespace, workload) (rate({__name__="backpressure_queue_arrivals_total",namespace="team-a"}[1m]))"#,
        ),
        (
            r#"label_replace(q{namespace="team-b"}, "namespace", "team-a", "", "")"#,
            r#"label_replace({__name__="q",namespace="team-a"}, "namespace", "team-a", "", "")"#,
        ),
        (
            r#"max_over_time(q[1h:1m] @ end() offset 5m)"#,
            r#"max_over_time({__name__="q",namespace="team-a"}[1h:1m] @ end() offset 5m)"#,
        ),
    ];
    for (q, want) in cases {
        let out = scoped(q);
        assert_eq!(out, want, "{q}");
        assert_scoped(q, &out, "team-a");
    }
}

#[test]
fn the_default_queries_scope_cleanly() {
    let q = r#"(max by (namespace, workload) (backpressure_queue_age_seconds)) or label_replace(max by (namespace, workload) (timestamp(backpressure_queue_age_seconds)), "bp_sample", "timestamp", "", "")"#;
    assert_scoped(q, &scoped(q), "team-a");
}

#[test]
fn queries_that_read_no_series_are_rejected() {
    for q in [
        "vector(100)",
        "100",
        "time()",
        "vector(1) * 100",
        "scalar(vector(1))",
    ] {
        assert_eq!(scope_to_namespace(q, "a"), Err(ScopeError::NoSeries), "{q}");
    }
    assert!(matches!(
        scope_to_namespace("", "a"),
        Err(ScopeError::Parse(_))
    ));
    assert!(matches!(
        scope_to_namespace("sum(", "a"),
        Err(ScopeError::Parse(_))
    ));
    assert!(matches!(
        scope_to_namespace(r#"info(foo, {k8s_cluster_name=~".+"})"#, "a"),
        Err(ScopeError::Unsupported(_))
    ));
}

#[test]
fn long_and_deep_queries_are_rejected_before_parsing() {
    let long = format!("foo{{a=\"{}\"}}", "x".repeat(MAX_QUERY_BYTES));
    assert!(matches!(
        scope_to_namespace(&long, "a"),
        Err(ScopeError::TooLong { .. })
    ));
    let deep = format!(
        "{}foo{}",
        "(".repeat(MAX_NESTING + 1),
        ")".repeat(MAX_NESTING + 1)
    );
    assert_eq!(scope_to_namespace(&deep, "a"), Err(ScopeError::TooDeep));
    let ok = format!("{}foo{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
    assert_scoped(&ok, &scoped(&ok), "team-a");
    // Brackets in strings and comments do not count; a comment cannot hide brackets.
    assert_eq!(nesting(r#"foo{a="((((("} # ((((("#), 1);
    assert_eq!(nesting("# \"\n((x))"), 2);
}

#[test]
fn names_and_strings_holding_promql_stay_data() {
    for q in [
        r#"{"x} or evil{namespace=\"team-b\"}"}"#,
        r#"{"namespace"="team-b", __name__="y"}"#,
        r#"foo{a="namespace=\"team-b\"", b='\'} or x{'}"#,
        r#"label_replace(foo, "x", "namespace=\"team-b\"", "", "")"#,
        "foo # {namespace=\"team-b\"}\n",
    ] {
        let out = scoped(q);
        assert_scoped(q, &out, "team-a");
        assert!(!out.contains("namespace=\"team-b\"}"), "{q} → {out}");
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("foo".to_owned()),
            Just("backpressure_queue_depth".to_owned()),
            Just("{\"a.b\"}".to_owned()),
            Just("{\"x} or y{namespace=\\\"b\\\"}\"}".to_owned()),
            Just("{__name__=~\"f.*\"}".to_owned()),
        ]
    }

    fn matcher() -> impl Strategy<Value = String> {
        let label = prop_oneof![
            Just("namespace"),
            Just("\"namespace\""),
            Just("workload"),
            Just("pod"),
        ];
        let op = prop_oneof![Just("="), Just("!="), Just("=~"), Just("!~")];
        let value = prop_oneof![
            Just("b"),
            Just("team-a"),
            Just(".*"),
            Just(""),
            Just("a|b"),
            Just("namespace=\\\"b\\\"")
        ];
        (label, op, value).prop_map(|(l, o, v)| format!("{l}{o}\"{v}\""))
    }

    /// An instant-vector selector: a name and matchers (some `or` groups), maybe `@`/offset.
    fn selector() -> impl Strategy<Value = String> {
        (
            name(),
            proptest::collection::vec(matcher(), 0..3),
            proptest::option::of(matcher()),
            prop_oneof![
                3 => Just(""),
                1 => Just(" offset 1m"),
                1 => Just(" @ 100"),
                1 => Just(" @ start() offset -5m"),
            ],
        )
            .prop_map(|(n, ms, or, suffix)| {
                let (base, extra) = if n.starts_with('{') {
                    (String::new(), n[1..n.len() - 1].to_owned())
                } else {
                    (n, String::new())
                };
                let mut all: Vec<String> = ms;
                if !extra.is_empty() {
                    all.push(extra);
                }
                let mut body = all.join(", ");
                if let Some(or) = or {
                    body = if body.is_empty() {
                        or
                    } else {
                        format!("{body} or {or}")
                    };
                }
                if body.is_empty() {
                    format!("{base}{suffix}")
                } else {
                    format!("{base}{{{body}}}{suffix}")
                }
            })
    }

    /// A range selector, as a function over it.
    fn range() -> impl Strategy<Value = String> {
        (
            selector(),
            prop_oneof![Just("rate"), Just("increase"), Just("max_over_time")],
        )
            .prop_map(|(s, f)| match s.find(" @").or_else(|| s.find(" offset")) {
                Some(i) => format!("{f}({}[5m]{})", &s[..i], &s[i..]),
                None => format!("{f}({s}[5m])"),
            })
    }

    /// An instant-vector expression.
    fn expr() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            6 => selector(),
            3 => range(),
            1 => Just("vector(1)".to_owned()),
            1 => Just("vector(time())".to_owned()),
        ];
        leaf.prop_recursive(5, 40, 3, |inner| {
            prop_oneof![
                inner
                    .clone()
                    .prop_map(|e| format!("sum by (namespace, workload) ({e})")),
                inner
                    .clone()
                    .prop_map(|e| format!("max_over_time(({e})[10m:1m])")),
                inner
                    .clone()
                    .prop_map(|e| format!("min_over_time(({e})[1h:] @ end() offset 1m)")),
                inner
                    .clone()
                    .prop_map(|e| format!("label_replace({e}, \"namespace\", \"b\", \"\", \"\")")),
                inner
                    .clone()
                    .prop_map(|e| format!("count_values(\"namespace\", {e})")),
                inner.clone().prop_map(|e| format!("topk(2, {e})")),
                inner.clone().prop_map(|e| format!("-({e})")),
                inner.clone().prop_map(|e| format!("absent({e})")),
                inner.clone().prop_map(|e| format!("{e} * 100")),
                inner
                    .clone()
                    .prop_map(|e| format!("({e}) # {{namespace=\"b\"}}\n")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} or {b}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} unless {b}")),
                (inner.clone(), inner.clone())
                    .prop_map(|(a, b)| format!("{a} * on (namespace) group_left (pod) {b}")),
                (inner.clone(), inner).prop_map(|(a, b)| format!("{a} / ignoring (namespace) {b}")),
            ]
        })
    }

    fn check(q: &str) -> Result<(), TestCaseError> {
        let result = scope_to_namespace(q, "team-a");
        if parser::parse(q).is_err() {
            prop_assert!(result.is_err(), "{q} does not parse but was accepted");
            return Ok(());
        }
        if let Ok(out) = result {
            let reparsed = parser::parse(&out);
            prop_assert!(reparsed.is_ok(), "{q} → {out} does not parse");
            if let Ok(e) = reparsed {
                prop_assert!(is_scoped_to(&e, "team-a"), "{q} → {out}");
            }
            // Rewriting is idempotent: the output scopes to itself.
            prop_assert_eq!(scope_to_namespace(&out, "team-a"), Ok(out.clone()));
            // Dating it keeps every selector, the timestamps' too, in the namespace (or says
            // why not: too many selectors).
            match crate::freshness::with_freshness(&out) {
                Ok(dated) => {
                    let e = parser::parse(&dated);
                    prop_assert!(
                        e.is_ok_and(|e| is_scoped_to(&e, "team-a")),
                        "{out} → {dated}"
                    );
                }
                Err(e) => prop_assert!(matches!(e, ScopeError::Unsupported(_)), "{out}: {e}"),
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn structured_queries_are_scoped_or_rejected(q in expr()) {
            check(&q)?;
        }

        #[test]
        fn arbitrary_text_never_panics(q in "[a-z_{}()\\[\\]\"'=~!,@:# \\n0-9.+*/^-]{0,80}") {
            check(&q)?;
        }

        #[test]
        fn arbitrary_namespaces_are_rendered_as_data(ns in ".{0,20}") {
            if let Ok(out) = scope_to_namespace("foo or bar{namespace=\"x\"}", &ns) {
                let reparsed = parser::parse(&out);
                prop_assert!(reparsed.is_ok_and(|e| is_scoped_to(&e, &ns)), "{ns:?} → {out}");
            }
        }
    }

    #[test]
    fn enough_generated_queries_parse() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = expr();
        let (mut parsed, mut accepted) = (0, 0);
        for _ in 0..500 {
            let Ok(tree) = strategy.new_tree(&mut runner) else {
                continue;
            };
            let q = tree.current();
            parsed += usize::from(parser::parse(&q).is_ok());
            accepted += usize::from(scope_to_namespace(&q, "team-a").is_ok());
        }
        // The property above is only as good as the share of inputs that reach the rewrite.
        assert!(
            parsed >= 150,
            "only {parsed} of 500 generated queries parse"
        );
        assert!(
            accepted >= 100,
            "only {accepted} of 500 generated queries were accepted"
        );
    }
}
