//! Kubernetes label selectors (`matchLabels` and `matchExpressions`) evaluated against a label
//! set, with the API server's validation rules.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Why a label selector cannot be evaluated. Kubernetes rejects the same selectors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error("matchExpressions[{index}].operator: unknown operator {operator:?}")]
    UnknownOperator {
        /// Position of the requirement in `matchExpressions`.
        index: usize,
        /// The operator as written.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with values.
    #[error("matchExpressions[{index}].values: {message}")]
    Values {
        /// Position of the requirement in `matchExpressions`.
        index: usize,
        /// What is wrong.
        message: &'static str,
    },
}

/// Whether `selector` selects an object with `labels`.
///
/// An absent selector and an empty selector (no `matchLabels`, no `matchExpressions`) select
/// everything, as documented on `BackpressurePolicy.spec.namespaceSelector`. All requirements
/// must hold (AND). `In` needs the key with one of the values; `NotIn` holds when the key is
/// absent or its value is not listed; `Exists` and `DoesNotExist` test the key only.
pub fn namespace_selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    // Validate every expression first, so that an invalid selector is an error even when an
    // earlier requirement already fails.
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    for (index, req) in expressions.iter().enumerate() {
        validate(index, req)?;
    }
    if let Some(match_labels) = &selector.match_labels {
        for (k, v) in match_labels {
            if labels.get(k) != Some(v) {
                return Ok(false);
            }
        }
    }
    for req in expressions {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        let holds = match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            // validate() admitted only the four operators.
            _ => value.is_none(),
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

fn validate(index: usize, req: &LabelSelectorRequirement) -> Result<(), SelectorError> {
    let has_values = req.values.as_ref().is_some_and(|v| !v.is_empty());
    match req.operator.as_str() {
        "In" | "NotIn" if !has_values => Err(SelectorError::Values {
            index,
            message: "must be non-empty for In and NotIn",
        }),
        "Exists" | "DoesNotExist" if has_values => Err(SelectorError::Values {
            index,
            message: "must be empty for Exists and DoesNotExist",
        }),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => Ok(()),
        other => Err(SelectorError::UnknownOperator {
            index,
            operator: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
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
}
