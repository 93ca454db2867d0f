//! Kubernetes label selectors, one evaluator for both forms the operator meets:
//!
//! - the structured `LabelSelector` (`matchLabels` and `matchExpressions`), as in
//!   `BackpressurePolicy.spec.namespaceSelector`, checked with the API server's validation rules
//!   ([`Selector::from_label_selector`], [`namespace_selector_matches`]);
//! - the string form the API server writes into `/scale` `status.selector`
//!   (`app=web,tier in (a,b),!canary`, [`Selector::parse`]).
//!
//! Both become a list of [`Requirement`]s that must all hold ([`Selector::matches`]).

mod parse;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Why a label selector cannot be used. Kubernetes rejects the same selectors.
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
    /// The string form does not parse; the message names the offending part.
    #[error("{message}")]
    Syntax {
        /// What is wrong, with the offending part.
        message: String,
    },
}

/// One requirement on a label set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// The key has this value (`k=v`, `k==v`, `matchLabels`).
    Eq(String, String),
    /// The key is absent or has another value (`k!=v`).
    NotEq(String, String),
    /// The key has one of the values (`k in (a,b)`, `In`).
    In(String, Vec<String>),
    /// The key is absent or has none of the values (`k notin (a,b)`, `NotIn`).
    NotIn(String, Vec<String>),
    /// The key is present (`k`, `Exists`).
    Exists(String),
    /// The key is absent (`!k`, `DoesNotExist`).
    NotExists(String),
}

impl Requirement {
    /// Whether `labels` satisfy the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// A label selector: requirements that must all hold (AND). The empty selector selects
/// everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses the string form of `/scale` `status.selector`. An empty text gives the empty
    /// selector; a caller that must not select everything refuses it first.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        parse::requirements(text)
            .map(Selector)
            .map_err(|message| SelectorError::Syntax { message })
    }

    /// The requirements of a `LabelSelector`: `matchLabels` as equalities, then
    /// `matchExpressions`. Every expression is validated first, so that an invalid selector is
    /// an error even when an earlier requirement would already fail.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let expressions = selector.match_expressions.as_deref().unwrap_or_default();
        let mut reqs: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::Eq(k.clone(), v.clone()))
            .collect();
        for (index, req) in expressions.iter().enumerate() {
            reqs.push(expression(index, req)?);
        }
        Ok(Selector(reqs))
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[Requirement] {
        &self.0
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }
}

impl TryFrom<&LabelSelector> for Selector {
    type Error = SelectorError;

    fn try_from(selector: &LabelSelector) -> Result<Self, SelectorError> {
        Selector::from_label_selector(selector)
    }
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
    match selector {
        None => Ok(true),
        Some(selector) => Ok(Selector::from_label_selector(selector)?.matches(labels)),
    }
}

/// One `matchExpressions` entry as a [`Requirement`], with the API server's rules: `In` and
/// `NotIn` need values, `Exists` and `DoesNotExist` take none, no other operator.
fn expression(index: usize, req: &LabelSelectorRequirement) -> Result<Requirement, SelectorError> {
    let values = req.values.clone().unwrap_or_default();
    let key = req.key.clone();
    match req.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(SelectorError::Values {
            index,
            message: "must be non-empty for In and NotIn",
        }),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(SelectorError::Values {
            index,
            message: "must be empty for Exists and DoesNotExist",
        }),
        "In" => Ok(Requirement::In(key, values)),
        "NotIn" => Ok(Requirement::NotIn(key, values)),
        "Exists" => Ok(Requirement::Exists(key)),
        "DoesNotExist" => Ok(Requirement::NotExists(key)),
        other => Err(SelectorError::UnknownOperator {
            index,
            operator: other.to_owned(),
        }),
    }
}
