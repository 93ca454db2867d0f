//! Both forms of a label selector: the structured `LabelSelector` (a table of cases, the API
//! server's validation) and the string form of `/scale` `status.selector` (parsing, hostile
//! input, and a property test against the API server's meaning of each requirement).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: op.to_owned(),
        values: if values.is_empty() {
            None
        } else {
            Some(values.iter().map(|v| (*v).to_owned()).collect())
        },
    }
}

fn sel(match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
    LabelSelector {
        match_labels: if match_labels.is_empty() {
            None
        } else {
            Some(labels(match_labels))
        },
        match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
    }
}

#[test]
fn table() {
    let ns = labels(&[("team", "payments"), ("env", "prod")]);
    let cases: Vec<(&str, Option<LabelSelector>, bool)> = vec![
        ("absent selects all", None, true),
        ("empty selects all", Some(sel(&[], vec![])), true),
        (
            "matchLabels hit",
            Some(sel(&[("team", "payments")], vec![])),
            true,
        ),
        (
            "matchLabels miss",
            Some(sel(&[("team", "search")], vec![])),
            false,
        ),
        (
            "matchLabels all must hold",
            Some(sel(&[("team", "payments"), ("env", "dev")], vec![])),
            false,
        ),
        (
            "In hit",
            Some(sel(&[], vec![expr("env", "In", &["prod", "staging"])])),
            true,
        ),
        (
            "In miss",
            Some(sel(&[], vec![expr("env", "In", &["dev"])])),
            false,
        ),
        (
            "In absent key",
            Some(sel(&[], vec![expr("tier", "In", &["a"])])),
            false,
        ),
        (
            "NotIn hit",
            Some(sel(&[], vec![expr("env", "NotIn", &["prod"])])),
            false,
        ),
        (
            "NotIn miss",
            Some(sel(&[], vec![expr("env", "NotIn", &["dev"])])),
            true,
        ),
        (
            "NotIn absent key",
            Some(sel(&[], vec![expr("tier", "NotIn", &["a"])])),
            true,
        ),
        (
            "Exists",
            Some(sel(&[], vec![expr("team", "Exists", &[])])),
            true,
        ),
        (
            "Exists absent",
            Some(sel(&[], vec![expr("tier", "Exists", &[])])),
            false,
        ),
        (
            "DoesNotExist",
            Some(sel(&[], vec![expr("tier", "DoesNotExist", &[])])),
            true,
        ),
        (
            "DoesNotExist present",
            Some(sel(&[], vec![expr("team", "DoesNotExist", &[])])),
            false,
        ),
        (
            "labels and expressions combine",
            Some(sel(
                &[("team", "payments")],
                vec![
                    expr("env", "In", &["prod"]),
                    expr("tier", "DoesNotExist", &[]),
                ],
            )),
            true,
        ),
    ];
    for (name, selector, want) in cases {
        assert_eq!(
            namespace_selector_matches(selector.as_ref(), &ns),
            Ok(want),
            "{name}"
        );
    }
}

#[test]
fn invalid_selectors_are_errors() {
    let ns = labels(&[("team", "payments")]);
    let bad_op = sel(&[], vec![expr("team", "Equals", &["payments"])]);
    assert!(matches!(
        namespace_selector_matches(Some(&bad_op), &ns),
        Err(SelectorError::UnknownOperator { index: 0, .. })
    ));
    let in_without_values = sel(&[], vec![expr("team", "In", &[])]);
    assert!(matches!(
        namespace_selector_matches(Some(&in_without_values), &ns),
        Err(SelectorError::Values { index: 0, .. })
    ));
    // An invalid second expression is reported even though the first one already fails.
    let exists_with_values = sel(
        &[],
        vec![expr("nope", "Exists", &[]), expr("team", "Exists", &["x"])],
    );
    let err = namespace_selector_matches(Some(&exists_with_values), &ns).unwrap_err();
    assert!(
        err.to_string().contains("matchExpressions[1].values"),
        "{err}"
    );
}

#[test]
fn both_forms_give_the_same_requirements() {
    let structured = sel(
        &[("app", "web")],
        vec![
            expr("tier", "In", &["a", "b"]),
            expr("env", "NotIn", &["prod"]),
            expr("track", "Exists", &[]),
            expr("canary", "DoesNotExist", &[]),
        ],
    );
    let from_labels = Selector::try_from(&structured).unwrap();
    let parsed = Selector::parse("app=web,tier in (a,b),env notin (prod),track,!canary").unwrap();
    assert_eq!(from_labels, parsed);
    assert_eq!(parsed.requirements().len(), 5);
}

#[test]
fn parses_and_matches_selectors() {
    let s = Selector::parse("app=web,tier in (a, b),!canary,env!=prod,track").unwrap();
    assert!(s.matches(&labels(&[("app", "web"), ("tier", "a"), ("track", "x")])));
    assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("track", "x")])));
    assert!(!s.matches(&labels(&[
        ("app", "web"),
        ("tier", "a"),
        ("canary", "1"),
        ("track", "x")
    ])));
    assert!(!s.matches(&labels(&[
        ("app", "web"),
        ("tier", "a"),
        ("env", "prod"),
        ("track", "x")
    ])));
    assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a")])));
    let n = Selector::parse("tier notin (x)").unwrap();
    assert!(n.matches(&labels(&[])));
    assert!(!n.matches(&labels(&[("tier", "x")])));
    assert!(Selector::parse("tier in x").is_err());
    assert!(Selector::parse("a=b,,c=d").is_err());
}

#[test]
fn hostile_selectors_are_refused_with_the_offending_part() {
    for (text, says) in [
        ("=b", "empty label key"),
        ("!", "empty label key"),
        ("a b=c", "invalid label key"),
        ("a=b c", "invalid label value"),
        ("a in ()", "empty value set"),
        ("a in (b", "expected (values)"),
        (")a=b", "invalid label key"),
        ("a in (x y)", "invalid label value"),
        ("a exists", "unknown operator"),
    ] {
        let err = Selector::parse(text).unwrap_err();
        assert!(err.to_string().contains(says), "{text:?}: {err}");
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z][a-z0-9]{0,5}",
            "[a-z]{1,4}\\.io/[a-z]{1,5}",
            Just("app".to_owned()),
            Just("tier".to_owned()),
        ]
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9]{1,4}",
            Just("web".to_owned()),
            Just("a".to_owned())
        ]
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        prop_oneof![
            (key(), value()).prop_map(|(k, v)| Requirement::Eq(k, v)),
            (key(), value()).prop_map(|(k, v)| Requirement::NotEq(k, v)),
            (key(), proptest::collection::vec(value(), 1..4))
                .prop_map(|(k, v)| Requirement::In(k, v)),
            (key(), proptest::collection::vec(value(), 1..4))
                .prop_map(|(k, v)| Requirement::NotIn(k, v)),
            key().prop_map(Requirement::Exists),
            key().prop_map(Requirement::NotExists),
        ]
    }

    /// The string form the API server writes into `/scale` `status.selector`.
    fn render(r: &Requirement) -> String {
        match r {
            Requirement::Eq(k, v) => format!("{k}={v}"),
            Requirement::NotEq(k, v) => format!("{k}!={v}"),
            Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
            Requirement::Exists(k) => k.clone(),
            Requirement::NotExists(k) => format!("!{k}"),
        }
    }

    /// The meaning of each requirement, written independently of `Selector::matches`.
    fn holds(r: &Requirement, labels: &BTreeMap<String, String>) -> bool {
        match r {
            Requirement::Eq(k, v) => labels.get(k).map(String::as_str) == Some(v.as_str()),
            Requirement::NotEq(k, v) => labels.get(k).map(String::as_str) != Some(v.as_str()),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !labels.get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }

    proptest! {
        #[test]
        fn selector_parser_never_panics(s in "\\PC{0,60}") {
            let _ = Selector::parse(&s);
        }

        #[test]
        fn selector_parser_never_panics_on_selector_like_text(s in "[a-z!=(), .a-z/-]{0,40}") {
            match Selector::parse(&s) {
                Ok(sel) => prop_assert!(!sel.0.is_empty() || s.trim().is_empty()),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn rendered_selectors_parse_back_and_match_like_the_api_server(
            reqs in proptest::collection::vec(requirement(), 1..5),
            labels in proptest::collection::btree_map(key(), value(), 0..5),
            spaces in any::<bool>(),
        ) {
            let sep = if spaces { ", " } else { "," };
            let text = reqs.iter().map(render).collect::<Vec<_>>().join(sep);
            let parsed = Selector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            prop_assert_eq!(&parsed.0, &reqs, "{}", text);
            let want = reqs.iter().all(|r| holds(r, &labels));
            prop_assert_eq!(parsed.matches(&labels), want);
        }
    }
}
