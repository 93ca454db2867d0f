//! What a tenant may reach through `spec.metrics`: its queries scoped to its own namespace
//! ([`query`], [`scoped_queries`]) and the Prometheus addresses it may name, matched on their
//! origin, with credentials never shown ([`address`]). Pure functions; the operator applies them
//! before any query leaves.

pub mod address;
pub mod query;

use backpressure_api::v1alpha1::{QueryOverrides, QueueSystem};

use crate::resolve::{EffectiveMetrics, FieldError};

/// The queries an object runs, per metric kind: the text to send, or `None` for the default
/// query of the wire contract (which returns its own sample timestamps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetQueries {
    /// Backoff, failure rate and the four queue kinds, by their `spec.metrics.queries` field.
    pub queries: QueryOverrides,
    /// The most consumers that can work at once (Kafka partitions), from a queue preset; no
    /// default query.
    pub partitions: Option<String>,
}

impl FleetQueries {
    /// The slot of `kind` (its field name in `spec.metrics.queries`, or `partitions`).
    fn slot(&mut self, kind: &str) -> Option<&mut Option<String>> {
        let q = &mut self.queries;
        Some(match kind {
            "backoff" => &mut q.backoff,
            "failureRate" => &mut q.failure_rate,
            "queueAge" => &mut q.queue_age,
            "queueDepth" => &mut q.queue_depth,
            "arrivalRate" => &mut q.arrival_rate,
            "completionRate" => &mut q.completion_rate,
            "partitions" => &mut self.partitions,
            _ => return None,
        })
    }
}

/// The queries to run for an object in `namespace` whose resolved metrics are `metrics`:
///
/// - an override the object wrote itself (tenant input) is rewritten by
///   [`query::scope_to_namespace`], unless a matching policy allows cross-namespace queries
///   (then it runs as written);
/// - an override from a policy's `defaults` is platform input and runs as written, like the
///   built-in default queries: it may read every namespace, and the object still picks only
///   the series labelled with its own namespace and workload;
/// - the queue queries of `spec.queue` ([`crate::presets`]), for the kinds no override sets,
///   are built from the object's input and treated like its own overrides (scoped unless a
///   policy allows cross-namespace queries);
/// - every one of them then gets the timestamps of the series it reads
///   ([`crate::freshness::with_freshness`]), so that `staleAfter` applies to it as to the
///   default queries.
///
/// Every query that cannot be scoped or dated is an error naming its field (`spec.queue.<system
/// section>` for a preset's); one is enough for the object's metrics to be unavailable (nothing
/// is read for it).
pub fn scoped_queries(
    metrics: &EffectiveMetrics,
    namespace: &str,
) -> Result<FleetQueries, Vec<FieldError>> {
    // (kind, text, field, tenant input)
    let mut todo: Vec<(&str, String, String, bool)> = Vec::new();
    let mut given = FleetQueries {
        queries: metrics.queries.clone(),
        partitions: None,
    };
    for (kind, source) in &metrics.query_sources {
        if let Some(text) = given.slot(kind).and_then(Option::take) {
            todo.push((kind, text, source.field.clone(), source.tenant));
        }
    }
    let preset = crate::presets::preset_queries(
        &metrics.queue,
        namespace,
        &metrics.workload,
        metrics.rate_window,
    );
    if let Some(p) = preset {
        let field = format!("spec.queue.{}", section(metrics.queue.system));
        for (kind, text) in [
            ("queueAge", p.queue_age),
            ("queueDepth", p.queue_depth),
            ("arrivalRate", p.arrival_rate),
            ("completionRate", p.completion_rate),
            ("partitions", p.partitions),
        ] {
            if let Some(text) = text
                && !metrics.query_sources.contains_key(kind)
            {
                todo.push((kind, text, field.clone(), true));
            }
        }
    }

    let mut out = FleetQueries::default();
    let mut errors = Vec::new();
    let scoped = metrics.access.cross_namespace_by.is_none();
    for (kind, text, field, tenant) in todo {
        let tenant_scoped = scoped && tenant;
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
            Ok(q) => {
                if let Some(slot) = out.slot(kind) {
                    *slot = Some(q);
                }
            }
            Err(e) => errors.push(FieldError {
                field,
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

/// The section of `spec.queue` that names the queue in `system`.
fn section(system: QueueSystem) -> &'static str {
    match system {
        QueueSystem::RedisStreams => "redisStreams",
        QueueSystem::RabbitMQ => "rabbitMQ",
        QueueSystem::SQS => "sqs",
        QueueSystem::Kafka => "kafka",
        QueueSystem::PubSub => "pubSub",
        QueueSystem::Custom => "system",
    }
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
            value(&q.queries.queue_age),
            r#"max by (namespace, workload) ({__name__="age",namespace="a"})"#
        );
        assert!(
            q.queries
                .queue_age
                .as_deref()
                .unwrap_or_default()
                .contains(r#"timestamp({__name__="age",namespace="a"})"#),
            "the timestamps are read from the scoped selector: {:?}",
            q.queries.queue_age
        );
        assert_eq!(
            value(&q.queries.backoff),
            r#"avg by (namespace, workload) ({__name__="b"})"#
        );
        assert_eq!(q.queries.failure_rate, None);

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
            value(&q.queries.queue_age),
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

    #[test]
    fn a_queue_preset_fills_the_queue_kinds_no_override_sets_scoped_and_dated() {
        use backpressure_api::v1alpha1::{KafkaQueue, QueueSpec, QueueSystem};
        let mut s = spec(QueryOverrides {
            queue_depth: Some("sum by (namespace, workload) (my_depth)".into()),
            ..Default::default()
        });
        s.queue = Some(QueueSpec {
            system: QueueSystem::Kafka,
            kafka: Some(KafkaQueue {
                topic: "orders".into(),
                consumer_group: "workers".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let eff = resolve(&s, &[], Timestamp::UNIX_EPOCH).unwrap();
        let q = scoped_queries(&eff.metrics, "shop").unwrap();
        let age = q.queries.queue_age.as_deref().unwrap_or_default();
        assert!(
            age.starts_with(r#"(label_replace(label_replace(max({__name__="kafka_consumergroup_group_lag_seconds","#),
            "{age}"
        );
        assert!(
            age.contains(r#"namespace="shop""#) && age.contains("bp_sample"),
            "{age}"
        );
        // The object's own query wins for its kind; backoff and failure rate stay the defaults.
        let depth = q.queries.queue_depth.as_deref().unwrap_or_default();
        assert!(
            depth.starts_with(
                r#"(sum by (namespace, workload) ({__name__="my_depth",namespace="shop"}))"#
            ),
            "{depth}"
        );
        assert_eq!(
            (q.queries.backoff.as_ref(), q.queries.failure_rate.as_ref()),
            (None, None)
        );
        for kind in [
            &q.queries.arrival_rate,
            &q.queries.completion_rate,
            &q.partitions,
        ] {
            let text = kind.as_deref().unwrap_or_default();
            let e = promql_parser::parser::parse(text).unwrap();
            assert!(query::is_scoped_to(&e, "shop"), "{text}");
        }

        // A policy that allows cross-namespace queries: the preset reads the exporter where
        // it runs (another namespace), still dated.
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
        let q = scoped_queries(&eff.metrics, "shop").unwrap();
        let age = q.queries.queue_age.as_deref().unwrap_or_default();
        assert!(
            !age.contains(r#"namespace="shop","#) && age.contains("bp_sample"),
            "{age}"
        );
    }
}
