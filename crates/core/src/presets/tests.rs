use std::time::Duration;

use backpressure_api::v1alpha1::{KafkaExporter, QueueSystem, SqsExporter};
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr};

use super::*;
use crate::tenancy::query::{is_scoped_to, scope_to_namespace, walk};

fn queue(system: QueueSystem, source: QueueSource) -> EffectiveQueue {
    EffectiveQueue {
        system,
        source: Some(source),
        job: None,
        instance: None,
        stale_after: Duration::from_secs(60),
    }
}

fn redis() -> EffectiveQueue {
    queue(
        QueueSystem::RedisStreams,
        QueueSource::RedisStreams {
            stream: "orders".into(),
            group: "workers".into(),
            db: 0,
        },
    )
}

fn rabbit() -> EffectiveQueue {
    queue(
        QueueSystem::RabbitMQ,
        QueueSource::RabbitMq {
            queue: "orders".into(),
            vhost: "/".into(),
        },
    )
}

fn sqs(exporter: SqsExporter) -> EffectiveQueue {
    queue(
        QueueSystem::SQS,
        QueueSource::Sqs {
            queue: "orders.fifo".into(),
            exporter,
            period: Duration::from_secs(300),
        },
    )
}

fn kafka(exporter: KafkaExporter, partitions: Option<i32>) -> EffectiveQueue {
    queue(
        QueueSystem::Kafka,
        QueueSource::Kafka {
            topic: "orders".into(),
            group: "workers".into(),
            exporter,
            cluster: Some("main".into()),
            partitions,
        },
    )
}

fn pubsub() -> EffectiveQueue {
    queue(
        QueueSystem::PubSub,
        QueueSource::PubSub {
            subscription: "orders-workers".into(),
            project: Some("shop-prod".into()),
        },
    )
}

fn every_preset() -> Vec<(&'static str, EffectiveQueue)> {
    vec![
        ("redis", redis()),
        ("rabbitmq", rabbit()),
        ("sqs-yace", sqs(SqsExporter::YACE)),
        (
            "sqs-cloudwatch-exporter",
            sqs(SqsExporter::CloudWatchExporter),
        ),
        ("sqs-worker", sqs(SqsExporter::Worker)),
        (
            "kafka-lag-exporter",
            kafka(KafkaExporter::KafkaLagExporter, None),
        ),
        ("kminion", kafka(KafkaExporter::KMinion, None)),
        ("pubsub", pubsub()),
    ]
}

fn built(q: &EffectiveQueue) -> PresetQueries {
    preset_queries(q, "shop", "export-worker", Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no preset for {q:?}"))
}

fn all(p: &PresetQueries) -> Vec<(&'static str, &String)> {
    [
        ("queueAge", p.queue_age.as_ref()),
        ("queueDepth", p.queue_depth.as_ref()),
        ("arrivalRate", p.arrival_rate.as_ref()),
        ("completionRate", p.completion_rate.as_ref()),
        ("partitions", p.partitions.as_ref()),
    ]
    .into_iter()
    .filter_map(|(k, q)| Some((k, q?)))
    .collect()
}

/// Every equality matcher `label="value"` of every selector of `expr`.
fn matchers(expr: &Expr) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(expr, &mut |e| {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return,
        };
        for m in vs
            .matchers
            .matchers
            .iter()
            .chain(vs.matchers.or_matchers.iter().flatten())
        {
            if m.op == MatchOp::Equal {
                out.push((m.name.clone(), m.value.clone()));
            }
        }
    });
    out
}

#[test]
fn custom_has_no_preset() {
    let q = EffectiveQueue::custom(Duration::from_secs(60));
    assert_eq!(preset_queries(&q, "a", "w", Duration::from_secs(60)), None);
}

#[test]
fn every_preset_query_parses_scopes_and_is_dated() {
    for (name, q) in every_preset() {
        let p = built(&q);
        for (kind, text) in all(&p) {
            let expr = parser::parse(text).unwrap_or_else(|e| panic!("{name} {kind}: {e}\n{text}"));
            // Every selector is about this queue (and nothing reads another namespace once
            // scoped).
            let m = matchers(&expr);
            assert!(
                m.iter().any(|(k, v)| v == "orders"
                    || v == "orders.fifo"
                    || v == "orders-workers" && k == "subscription_id"),
                "{name} {kind}: no selector names the queue: {text}"
            );
            let scoped = scope_to_namespace(text, "shop")
                .unwrap_or_else(|e| panic!("{name} {kind}: {e}\n{text}"));
            let dated = crate::freshness::with_freshness(&scoped)
                .unwrap_or_else(|e| panic!("{name} {kind}: {e}\n{scoped}"));
            let reparsed = parser::parse(&dated).unwrap();
            assert!(is_scoped_to(&reparsed, "shop"), "{name} {kind}: {dated}");
        }
    }
}

#[test]
fn the_queue_names_are_data_never_promql() {
    let hostile = r#"x"} or {__name__=~".+", namespace="other"} or {a="$1\"#;
    let cases = [
        queue(
            QueueSystem::RedisStreams,
            QueueSource::RedisStreams {
                stream: hostile.into(),
                group: hostile.into(),
                db: 3,
            },
        ),
        queue(
            QueueSystem::RabbitMQ,
            QueueSource::RabbitMq {
                queue: hostile.into(),
                vhost: hostile.into(),
            },
        ),
        queue(
            QueueSystem::Kafka,
            QueueSource::Kafka {
                topic: hostile.into(),
                group: hostile.into(),
                exporter: KafkaExporter::KMinion,
                cluster: None,
                partitions: None,
            },
        ),
    ];
    for mut q in cases {
        q.job = Some(hostile.into());
        let p = preset_queries(&q, "shop", hostile, Duration::from_secs(30)).unwrap();
        for (kind, text) in all(&p) {
            let expr = parser::parse(text).unwrap_or_else(|e| panic!("{kind}: {e}\n{text}"));
            let m = matchers(&expr);
            assert!(
                m.iter().any(|(k, v)| k == "job" && v == hostile),
                "{kind}: {text}"
            );
            // Every selector has the job matcher: no selector came out of a name.
            let mut selectors = 0;
            walk(&expr, &mut |e| {
                selectors += usize::from(matches!(
                    e,
                    Expr::VectorSelector(_) | Expr::MatrixSelector(_)
                ));
            });
            assert_eq!(
                m.iter().filter(|(k, _)| k == "job").count(),
                selectors,
                "{kind}: {text}"
            );
            assert!(
                !m.iter().any(|(k, v)| k == "namespace" && v == "other"),
                "{kind}: {text}"
            );
            // The workload label is set to the workload itself: `$` doubled in the replacement.
            assert!(
                text.contains(
                    r#""workload", "x\"} or {__name__=~\".+\", namespace=\"other\"} or {a=\"$$1\\""#
                ),
                "{kind}: {text}"
            );
        }
    }
}

#[test]
fn kafka_counts_partitions_only_when_the_object_does_not_state_them() {
    for exporter in [KafkaExporter::KafkaLagExporter, KafkaExporter::KMinion] {
        assert!(built(&kafka(exporter, None)).partitions.is_some());
        assert_eq!(built(&kafka(exporter, Some(12))).partitions, None);
    }
    for (name, q) in every_preset() {
        if !name.starts_with("kafka") && name != "kminion" {
            assert_eq!(built(&q).partitions, None, "{name}");
        }
    }
}

#[test]
fn the_pubsub_window_is_at_least_five_minutes() {
    let p = preset_queries(&pubsub(), "shop", "w", Duration::from_secs(30)).unwrap();
    assert!(p.completion_rate.unwrap().contains("[5m]"));
    let p = preset_queries(&pubsub(), "shop", "w", Duration::from_secs(600)).unwrap();
    assert!(p.completion_rate.unwrap().contains("[10m]"));
}

/// The queries of every preset, compared with `golden.txt` (one `<preset> <kind>: <query>`
/// line each). After a deliberate change: `BP_BLESS=1 cargo test -p backpressure-core --lib
/// presets` rewrites the file; review its diff.
#[test]
fn golden() {
    let mut text = String::new();
    for (name, q) in every_preset() {
        let p = built(&q);
        for (kind, query) in all(&p) {
            text.push_str(&format!("{name} {kind}: {query}\n"));
        }
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/presets/golden.txt");
    if std::env::var_os("BP_BLESS").is_some() {
        std::fs::write(path, &text).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap();
    for (got, want) in text.lines().zip(want.lines()) {
        assert_eq!(got, want);
    }
    assert_eq!(text.lines().count(), want.lines().count());
}
