//! What a tenant may reach through `spec.metrics`: its queries scoped to its own namespace
//! ([`query`], [`scoped_queries`]) and the Prometheus addresses it may name, matched on their
//! origin, with credentials never shown ([`address`]). Pure functions; the operator applies them
//! before any query leaves.

pub mod address;
pub mod query;

use backpressure_api::v1alpha1::QueryOverrides;

use crate::resolve::{EffectiveMetrics, FieldError};

/// The queries to run for an object in `namespace` whose resolved metrics are `metrics`:
///
/// - an override the object wrote itself (tenant input) is rewritten by
///   [`query::scope_to_namespace`], unless a matching policy allows cross-namespace queries
///   (then it runs as written);
/// - an override from a policy's `defaults` is platform input and runs as written, like the
///   built-in default queries: it may read every namespace, and the object still picks only
///   the series labelled with its own namespace and workload;
/// - every override then gets the timestamps of the series it reads
///   ([`crate::freshness::with_freshness`]), so that `staleAfter` applies to it as to the
///   default queries.
///
/// Every override that cannot be scoped or dated is an error naming its field; one is enough
/// for the object's metrics to be unavailable (nothing is read for it).
pub fn scoped_queries(
    metrics: &EffectiveMetrics,
    namespace: &str,
) -> Result<QueryOverrides, Vec<FieldError>> {
    let mut out = metrics.queries.clone();
    let mut errors = Vec::new();
    let scoped = metrics.access.cross_namespace_by.is_none();
    for (kind, source) in &metrics.query_sources {
        let Some(slot) = query_slot(&mut out, kind) else {
            continue;
        };
        let Some(text) = slot.take() else {
            continue;
        };
        let tenant_scoped = scoped && source.tenant;
        let run = if tenant_scoped {
            query::scope_to_namespace(&text, namespace)
        } else {
            Ok(text)
        }
        .and_then(|q| crate::freshness::with_freshness(&q))
        .and_then(|q| {
            // The timestamps read the same selectors, scoped as they were.
            if tenant_scoped && !query::is_scoped_to(&query::parse_unchecked(&q)?, namespace) {
                return Err(query::ScopeError::NotFaithful);
            }
            Ok(q)
        });
        match run {
            Ok(q) => *slot = Some(q),
            Err(e) => errors.push(FieldError {
                field: source.field.clone(),
                message: format!("rejected: {e}"),
            }),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The override of `kind` (its field name in `spec.metrics.queries`).
fn query_slot<'a>(q: &'a mut QueryOverrides, kind: &str) -> Option<&'a mut Option<String>> {
    Some(match kind {
        "backoff" => &mut q.backoff,
        "failureRate" => &mut q.failure_rate,
        "queueAge" => &mut q.queue_age,
        "queueDepth" => &mut q.queue_depth,
        "arrivalRate" => &mut q.arrival_rate,
        "completionRate" => &mut q.completion_rate,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::{PolicyInput, resolve};
    use backpressure_api::v1alpha1::{
        BackpressurePolicySpec, MetricsAccess, MetricsSpec, PolicyDefaults, TargetRef,
        WorkerBackpressureSpec,
    };
    use k8s_openapi::jiff::Timestamp;

    fn spec(queries: QueryOverrides) -> WorkerBackpressureSpec {
        WorkerBackpressureSpec {
            target_ref: TargetRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                name: "w".into(),
            },
            metrics: Some(MetricsSpec {
                queries: Some(queries),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_objects_queries_are_scoped_the_policies_run_as_written() {
        let policy = BackpressurePolicySpec {
            defaults: Some(PolicyDefaults {
                metrics: Some(MetricsSpec {
                    queries: Some(QueryOverrides {
                        backoff: Some("avg by (namespace, workload) (b)".into()),
                        queue_age: Some("ignored, the object has its own".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = spec(QueryOverrides {
            queue_age: Some(r#"max by (namespace, workload) (age{namespace="b"})"#.into()),
            ..Default::default()
        });
        let policies = [PolicyInput {
            name: "p",
            spec: &policy,
        }];
        let eff = resolve(&s, &policies, Timestamp::UNIX_EPOCH).unwrap();
        let q = scoped_queries(&eff.metrics, "a").unwrap();
        let value = |q: &Option<String>| {
            let q = q.as_deref().unwrap_or_default();
            let end = q.find(") or label_replace(").unwrap_or_default();
            q[1..end].to_owned()
        };
        assert_eq!(
            value(&q.queue_age),
            r#"max by (namespace, workload) ({__name__="age",namespace="a"})"#
        );
        assert!(
            q.queue_age
                .as_deref()
                .unwrap_or_default()
                .contains(r#"timestamp({__name__="age",namespace="a"})"#),
            "the timestamps are read from the scoped selector: {:?}",
            q.queue_age
        );
        assert_eq!(
            value(&q.backoff),
            r#"avg by (namespace, workload) ({__name__="b"})"#
        );
        assert_eq!(q.failure_rate, None);

        // A policy that allows cross-namespace queries: the object's run as written.
        let open = BackpressurePolicySpec {
            metrics_access: Some(MetricsAccess {
                allow_cross_namespace_queries: Some(true),
                prometheus_addresses: None,
            }),
            ..Default::default()
        };
        let policies = [PolicyInput {
            name: "open",
            spec: &open,
        }];
        let eff = resolve(&s, &policies, Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(
            eff.metrics.access.cross_namespace_by.as_deref(),
            Some("open")
        );
        let q = scoped_queries(&eff.metrics, "a").unwrap();
        assert_eq!(
            value(&q.queue_age),
            r#"max by (namespace, workload) ({__name__="age",namespace="b"})"#
        );
    }

    #[test]
    fn every_rejected_query_is_named() {
        let s = spec(QueryOverrides {
            queue_age: Some("vector(100)".into()),
            queue_depth: Some("sum(".into()),
            backoff: Some("b".into()),
            ..Default::default()
        });
        let eff = resolve(&s, &[], Timestamp::UNIX_EPOCH).unwrap();
        let errors = scoped_queries(&eff.metrics, "a").unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.metrics.queries.queueAge",
                "spec.metrics.queries.queueDepth"
            ]
        );
        assert!(
            errors[0].to_string().contains("reads no series"),
            "{}",
            errors[0]
        );
    }
}
