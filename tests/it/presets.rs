//! The queue presets evaluated by Prometheus' own engine (`promtool test rules`, Debian package
//! `prometheus`; no server): for every system, the queries the operator runs for an object in
//! namespace `shop` (built from `spec.queue`, scoped to the namespace and dated, exactly as
//! `backpressure_core::tenancy::scoped_queries` leaves them) over synthetic series named as
//! each exporter names them, with a decoy of the same queue in another namespace. Each answer
//! must be the value the preset documents, labelled with the object's namespace and workload,
//! with the sample timestamps beside it.

use std::path::PathBuf;
use std::process::Command;

use backpressure_api::v1alpha1::{TargetRef, WorkerBackpressureSpec};
use backpressure_core::resolve::resolve;
use backpressure_core::tenancy::{FleetQueries, scoped_queries};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("promtool not found on PATH: install the Debian package `prometheus` (`make deps` does)")
        })
}

/// The queries an object in `shop` with `queue` (its `spec.queue`, JSON) runs.
fn queries(queue: Value) -> FleetQueries {
    let spec = WorkerBackpressureSpec {
        target_ref: TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "export-worker".into(),
        },
        queue: Some(serde_json::from_value(queue).unwrap()),
        ..Default::default()
    };
    let eff = resolve(&spec, &[], Timestamp::UNIX_EPOCH).unwrap();
    scoped_queries(&eff.metrics, "shop").unwrap()
}

/// One preset: its `spec.queue`, the exporter's series (`name{labels}` without the namespace,
/// promtool's expanding notation, sampled every 15 s for 10 minutes), and per kind the value
/// expected at 10 minutes.
struct Case {
    name: &'static str,
    queue: Value,
    series: Vec<(&'static str, &'static str)>,
    expect: Vec<(&'static str, f64)>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "RedisStreams",
            queue: json!({"system": "RedisStreams", "redisStreams": {"stream": "orders", "consumerGroup": "workers"}}),
            series: vec![
                // 5 entries wait; the last one delivered was written at 570 s, the stream's
                // first at 100 s: the oldest waiting entry is at most 30 s old at 600 s.
                (
                    r#"redis_stream_group_lag{db="db0",stream="orders",group="workers"}"#,
                    "5+0x40",
                ),
                (
                    r#"redis_stream_group_last_delivered_id{db="db0",stream="orders",group="workers"}"#,
                    "570000+0x40",
                ),
                (
                    r#"redis_stream_first_entry_id{db="db0",stream="orders"}"#,
                    "100000+0x40",
                ),
                // 3 entries added and 1 read per second; the pending list is steady.
                (
                    r#"redis_stream_entries_added_total{db="db0",stream="orders"}"#,
                    "0+45x40",
                ),
                (
                    r#"redis_stream_group_entries_read{db="db0",stream="orders",group="workers"}"#,
                    "0+15x40",
                ),
                (
                    r#"redis_stream_group_messages_pending{db="db0",stream="orders",group="workers"}"#,
                    "8+0x40",
                ),
            ],
            expect: vec![
                ("queueAge", 30.0),
                ("queueDepth", 5.0),
                ("arrivalRate", 3.0),
                ("completionRate", 1.0),
            ],
        },
        Case {
            name: "RabbitMQ",
            queue: json!({"system": "RabbitMQ", "rabbitMQ": {"queue": "orders"}}),
            series: vec![
                // 120 ready, 4 delivered per second: an estimated 30 s.
                (
                    r#"rabbitmq_detailed_queue_messages_ready{vhost="/",queue="orders"}"#,
                    "120+0x40",
                ),
                (
                    r#"rabbitmq_detailed_queue_messages_delivered_ack_total{vhost="/",queue="orders"}"#,
                    "0+60x40",
                ),
                (
                    r#"rabbitmq_detailed_queue_exchange_messages_published_total{vhost="/",queue="orders",exchange="in"}"#,
                    "0+30x40",
                ),
                (
                    r#"rabbitmq_detailed_queue_exchange_messages_published_total{vhost="/",queue="orders",exchange="retry"}"#,
                    "0+15x40",
                ),
                (
                    r#"rabbitmq_detailed_queue_messages_acked_total{vhost="/",queue="orders"}"#,
                    "0+45x40",
                ),
            ],
            expect: vec![
                ("queueAge", 30.0),
                ("queueDepth", 120.0),
                ("arrivalRate", 3.0),
                ("completionRate", 3.0),
            ],
        },
        Case {
            // RabbitMQ 3.x (3.10.8 as Debian ships it): no per-queue counters, the per-channel
            // ones of `channel_queue_metrics` and `channel_queue_exchange_metrics`, summed.
            name: "RabbitMQ 3.x",
            queue: json!({"system": "RabbitMQ", "rabbitMQ": {"queue": "orders"}}),
            series: vec![
                // 120 ready, 2 + 2 taken per second with basic.get: an estimated 30 s.
                (
                    r#"rabbitmq_detailed_queue_messages_ready{vhost="/",queue="orders"}"#,
                    "120+0x40",
                ),
                (
                    r#"rabbitmq_detailed_channel_get_ack_total{channel="<0.801.0>",vhost="/",queue="orders"}"#,
                    "0+30x40",
                ),
                (
                    r#"rabbitmq_detailed_channel_get_ack_total{channel="<0.802.0>",vhost="/",queue="orders"}"#,
                    "0+30x40",
                ),
                (
                    r#"rabbitmq_detailed_channel_messages_delivered_ack_total{channel="<0.802.0>",vhost="/",queue="orders"}"#,
                    "0+0x40",
                ),
                (
                    r#"rabbitmq_detailed_queue_messages_published_total{channel="<0.790.0>",queue_vhost="/",queue="orders",exchange_vhost="/",exchange=""}"#,
                    "0+45x40",
                ),
                (
                    r#"rabbitmq_detailed_channel_messages_acked_total{channel="<0.801.0>",vhost="/",queue="orders"}"#,
                    "0+15x40",
                ),
                (
                    r#"rabbitmq_detailed_channel_messages_acked_total{channel="<0.802.0>",vhost="/",queue="orders"}"#,
                    "0+30x40",
                ),
            ],
            expect: vec![
                ("queueAge", 30.0),
                ("queueDepth", 120.0),
                ("arrivalRate", 3.0),
                ("completionRate", 3.0),
            ],
        },
        Case {
            name: "SQS (YACE)",
            queue: json!({"system": "SQS", "sqs": {"queue": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders", "period": "5m"}}),
            series: vec![
                (
                    r#"aws_sqs_approximate_age_of_oldest_message_maximum{dimension_QueueName="orders"}"#,
                    "42+0x40",
                ),
                (
                    r#"aws_sqs_approximate_number_of_messages_visible_average{dimension_QueueName="orders"}"#,
                    "700+0x40",
                ),
                (
                    r#"aws_sqs_number_of_messages_sent_sum{dimension_QueueName="orders"}"#,
                    "600+0x40",
                ),
                (
                    r#"aws_sqs_number_of_messages_deleted_sum{dimension_QueueName="orders"}"#,
                    "300+0x40",
                ),
            ],
            expect: vec![
                ("queueAge", 42.0),
                ("queueDepth", 700.0),
                ("arrivalRate", 2.0),
                ("completionRate", 1.0),
            ],
        },
        Case {
            // Two replicas of the worker library's SQS source: each polls the queue's depth
            // (600, growing 1/s) and counts its own first receives (2/s and 1/s) and deletes
            // (1/s each).
            name: "SQS (Worker)",
            queue: json!({"system": "SQS", "sqs": {"queue": "orders", "exporter": "Worker"}}),
            series: vec![
                (
                    r#"backpressure_queue_depth{queue="orders",workload="export-worker",pod="w-a"}"#,
                    "0+15x40",
                ),
                (
                    r#"backpressure_queue_depth{queue="orders",workload="export-worker",pod="w-b"}"#,
                    "0+15x40",
                ),
                (
                    r#"backpressure_sqs_first_receives_total{queue="orders",workload="export-worker",pod="w-a"}"#,
                    "0+30x40",
                ),
                (
                    r#"backpressure_sqs_first_receives_total{queue="orders",workload="export-worker",pod="w-b"}"#,
                    "0+15x40",
                ),
                (
                    r#"backpressure_queue_completions_total{queue="orders",workload="export-worker",pod="w-a"}"#,
                    "0+15x40",
                ),
                (
                    r#"backpressure_queue_completions_total{queue="orders",workload="export-worker",pod="w-b"}"#,
                    "0+15x40",
                ),
            ],
            expect: vec![
                // 600 visible at 3 first receives a second.
                ("queueAge", 200.0),
                ("queueDepth", 600.0),
                // 3 first receives a second plus 1 a second more visible.
                ("arrivalRate", 4.0),
                ("completionRate", 2.0),
            ],
        },
        Case {
            name: "SQS (cloudwatch_exporter)",
            queue: json!({"system": "SQS", "sqs": {"queue": "orders", "exporter": "CloudWatchExporter"}}),
            series: vec![
                (
                    r#"aws_sqs_approximate_age_of_oldest_message_maximum{queue_name="orders"}"#,
                    "42+0x40",
                ),
                (
                    r#"aws_sqs_approximate_number_of_messages_visible_maximum{queue_name="orders"}"#,
                    "700+0x40",
                ),
                (
                    r#"aws_sqs_number_of_messages_sent_sum{queue_name="orders"}"#,
                    "120+0x40",
                ),
                (
                    r#"aws_sqs_number_of_messages_deleted_sum{queue_name="orders"}"#,
                    "60+0x40",
                ),
            ],
            expect: vec![
                ("queueAge", 42.0),
                ("queueDepth", 700.0),
                ("arrivalRate", 2.0),
                ("completionRate", 1.0),
            ],
        },
        Case {
            name: "Kafka (kafka-lag-exporter)",
            queue: json!({"system": "Kafka", "kafka": {"topic": "orders", "consumerGroup": "workers"}}),
            series: vec![
                (
                    r#"kafka_consumergroup_group_lag_seconds{cluster_name="main",group="workers",topic="orders",partition="0"}"#,
                    "12+0x40",
                ),
                (
                    r#"kafka_consumergroup_group_lag_seconds{cluster_name="main",group="workers",topic="orders",partition="1"}"#,
                    "20+0x40",
                ),
                (
                    r#"kafka_consumergroup_group_lag{cluster_name="main",group="workers",topic="orders",partition="0"}"#,
                    "30+0x40",
                ),
                (
                    r#"kafka_consumergroup_group_lag{cluster_name="main",group="workers",topic="orders",partition="1"}"#,
                    "50+0x40",
                ),
                (
                    r#"kafka_partition_latest_offset{cluster_name="main",topic="orders",partition="0"}"#,
                    "0+30x40",
                ),
                (
                    r#"kafka_partition_latest_offset{cluster_name="main",topic="orders",partition="1"}"#,
                    "0+30x40",
                ),
                (
                    r#"kafka_partition_latest_offset{cluster_name="main",topic="orders",partition="2"}"#,
                    "0+30x40",
                ),
                (
                    r#"kafka_consumergroup_group_offset{cluster_name="main",group="workers",topic="orders",partition="0"}"#,
                    "0+15x40",
                ),
                (
                    r#"kafka_consumergroup_group_offset{cluster_name="main",group="workers",topic="orders",partition="1"}"#,
                    "0+15x40",
                ),
                // Another group on the same topic is not the workers'.
                (
                    r#"kafka_consumergroup_group_lag_seconds{cluster_name="main",group="audit",topic="orders",partition="0"}"#,
                    "9999+0x40",
                ),
            ],
            expect: vec![
                ("queueAge", 20.0),
                ("queueDepth", 80.0),
                ("arrivalRate", 6.0),
                ("completionRate", 2.0),
                ("partitions", 3.0),
            ],
        },
        Case {
            name: "Kafka (KMinion)",
            queue: json!({"system": "Kafka", "kafka": {"topic": "orders", "consumerGroup": "workers", "exporter": "KMinion"}}),
            series: vec![
                // 90 behind, 3 consumed per second: an estimated 30 s.
                (
                    r#"kminion_kafka_consumer_group_topic_lag{group_id="workers",topic_name="orders"}"#,
                    "90+0x40",
                ),
                (
                    r#"kminion_kafka_consumer_group_topic_offset_sum{group_id="workers",topic_name="orders"}"#,
                    "0+45x40",
                ),
                (
                    r#"kminion_kafka_topic_high_water_mark_sum{topic_name="orders"}"#,
                    "0+60x40",
                ),
                (
                    r#"kminion_kafka_consumer_group_topic_assigned_partitions{group_id="workers",topic_name="orders"}"#,
                    "6+0x40",
                ),
            ],
            expect: vec![
                ("queueAge", 30.0),
                ("queueDepth", 90.0),
                ("arrivalRate", 4.0),
                ("completionRate", 3.0),
                ("partitions", 6.0),
            ],
        },
        Case {
            name: "PubSub",
            queue: json!({"system": "PubSub", "pubSub": {"subscription": "projects/shop-prod/subscriptions/orders-workers"}}),
            series: vec![
                (
                    r#"stackdriver_pubsub_subscription_pubsub_googleapis_com_subscription_oldest_unacked_message_age{project_id="shop-prod",subscription_id="orders-workers",unit=""}"#,
                    "75+0x40",
                ),
                // The backlog grows by 1 a second while 2 a second are acked: 3 arrive.
                (
                    r#"stackdriver_pubsub_subscription_pubsub_googleapis_com_subscription_num_undelivered_messages{project_id="shop-prod",subscription_id="orders-workers",unit=""}"#,
                    "0+15x40",
                ),
                (
                    r#"stackdriver_pubsub_subscription_pubsub_googleapis_com_subscription_ack_message_count{project_id="shop-prod",subscription_id="orders-workers",unit=""}"#,
                    "0+30x40",
                ),
            ],
            expect: vec![
                ("queueAge", 75.0),
                ("queueDepth", 600.0),
                ("arrivalRate", 3.0),
                ("completionRate", 2.0),
            ],
        },
    ]
}

fn query_of<'a>(q: &'a FleetQueries, kind: &str) -> Option<&'a String> {
    let o = &q.queries;
    match kind {
        "queueAge" => o.queue_age.as_ref(),
        "queueDepth" => o.queue_depth.as_ref(),
        "arrivalRate" => o.arrival_rate.as_ref(),
        "completionRate" => o.completion_rate.as_ref(),
        "partitions" => q.partitions.as_ref(),
        _ => None,
    }
}

/// `{"a": "b"}` in promtool's label notation.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{{{}}}", inner.join(", "))
}

/// A series of the exporter in namespace `ns`.
fn in_namespace(series: &str, ns: &str) -> String {
    match series.split_once('{') {
        Some((name, rest)) => format!("{name}{{namespace=\"{ns}\",{rest}"),
        None => format!("{series}{{namespace=\"{ns}\"}}"),
    }
}

#[test]
fn every_preset_answers_what_it_documents_on_prometheus_own_engine() {
    let dir = std::env::temp_dir().join(format!(
        "bp-presets-{}-{}",
        std::process::id(),
        backpressure_envtest::unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tests = Vec::new();
    let mut checked = 0;
    for case in cases() {
        let q = queries(case.queue.clone());
        let mut input = Vec::new();
        for (series, values) in &case.series {
            input.push(json!({"series": in_namespace(series, "shop"), "values": values}));
            // The same queue's series in another namespace, far off: never read.
            input.push(json!({"series": in_namespace(series, "other"), "values": "1e9+0x40"}));
        }
        // Series of the worker library carry its workload label: their timestamps are dated
        // per (namespace, workload).
        let ns_group: &[(&str, &str)] = if case
            .series
            .iter()
            .all(|(s, _)| s.contains(r#"workload="export-worker""#))
        {
            &[
                ("bp_sample", "timestamp"),
                ("namespace", "shop"),
                ("workload", "export-worker"),
            ]
        } else {
            &[("bp_sample", "timestamp"), ("namespace", "shop")]
        };
        let mut exprs = Vec::new();
        for (kind, want) in &case.expect {
            let text =
                query_of(&q, kind).unwrap_or_else(|| panic!("{}: no {kind} query", case.name));
            // The value, labelled with the object's namespace and workload; the sample
            // timestamps of the namespace (the exporter's series carry no workload) and of
            // the whole query: the last sample, at 600 s.
            exprs.push(json!({
                "expr": text,
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": labels(&[("namespace", "shop"), ("workload", "export-worker")]), "value": want},
                    {"labels": labels(ns_group), "value": 600},
                    {"labels": labels(&[("bp_sample", "timestamp"), ("bp_scope", "query")]), "value": 600},
                ],
            }));
            checked += 1;
        }
        tests.push(json!({
            "interval": "15s",
            "input_series": input,
            "promql_expr_test": exprs,
        }));
    }
    let file = dir.join("presets_test.yaml");
    std::fs::write(
        &file,
        serde_yaml::to_string(&json!({"tests": tests})).unwrap(),
    )
    .unwrap();
    let out = Command::new(promtool())
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules:\n{text}");
    assert_eq!(checked, 38, "every kind of every preset is checked");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check can fail: a wrong expectation is reported.
#[test]
fn a_wrong_preset_expectation_fails_the_promtool_check() {
    let q = queries(
        json!({"system": "Kafka", "kafka": {"topic": "orders", "consumerGroup": "workers"}}),
    );
    let dir = std::env::temp_dir().join(format!(
        "bp-presets-bad-{}-{}",
        std::process::id(),
        backpressure_envtest::unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad_test.yaml");
    let test = json!({"tests": [{
        "interval": "15s",
        "input_series": [{"series": in_namespace(r#"kafka_consumergroup_group_lag{group="workers",topic="orders",partition="0"}"#, "shop"), "values": "30+0x40"}],
        "promql_expr_test": [{
            "expr": q.queries.queue_depth.unwrap(),
            "eval_time": "10m",
            "exp_samples": [
                {"labels": labels(&[("namespace", "shop"), ("workload", "export-worker")]), "value": 31},
                {"labels": labels(&[("bp_sample", "timestamp"), ("namespace", "shop")]), "value": 600},
                {"labels": labels(&[("bp_sample", "timestamp"), ("bp_scope", "query")]), "value": 600},
            ],
        }],
    }]});
    std::fs::write(&file, serde_yaml::to_string(&test).unwrap()).unwrap();
    let status = Command::new(promtool())
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap()
        .status;
    assert!(!status.success(), "promtool accepted a wrong value");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real `redis-server` (Debian's) on a free loopback port, without persistence.
struct Redis {
    port: u16,
    _process: backpressure_envtest::process::Supervised,
}

impl Redis {
    fn start(dir: &std::path::Path) -> Redis {
        let port = backpressure_envtest::process::free_port().unwrap();
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let process = backpressure_envtest::process::Supervised::spawn(
            "redis-server",
            std::path::Path::new("/usr/bin/redis-server"),
            &args,
            &dir.join("redis.log"),
        )
        .unwrap();
        assert!(
            backpressure_envtest::process::wait_for_port(port, std::time::Duration::from_secs(20)),
            "redis-server did not listen:\n{}",
            process.log_tail(20)
        );
        Redis {
            port,
            _process: process,
        }
    }

    /// Runs a command with `redis-cli` (Debian's redis-tools) and returns its output.
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// redis_exporter (built from the Go module proxy by tools/k8s/build.sh) for stream `orders`.
fn redis_exporter(
    redis: &Redis,
    port: u16,
    dir: &std::path::Path,
) -> backpressure_envtest::process::Supervised {
    let binary = backpressure_envtest::bin_dir()
        .unwrap()
        .join("redis_exporter");
    assert!(
        binary.is_file(),
        "{} is missing: run `make k8s-bins` (tools/k8s/build.sh builds it)",
        binary.display()
    );
    let args = vec![
        format!("--redis.addr=redis://127.0.0.1:{}", redis.port),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--check-single-streams=db0=orders".to_owned(),
    ];
    let p = backpressure_envtest::process::Supervised::spawn(
        "redis_exporter",
        &binary,
        &args,
        &dir.join(format!(
            "redis_exporter-{}.log",
            backpressure_envtest::unique()
        )),
    )
    .unwrap();
    assert!(
        backpressure_envtest::process::wait_for_port(port, std::time::Duration::from_secs(20)),
        "redis_exporter did not listen:\n{}",
        p.log_tail(20)
    );
    p
}

/// Scaled out for the backlog, with the arrival rate read over a whole rate window of traffic.
/// The queue's counters start with the test, and until one rate window (1 min) of traffic has
/// passed `rate()` sees only part of it: a publisher at 5/s read as 2.9/s 35 s in, in a CI run.
/// A preset that reads no arrivals never gets here.
fn scaled_out_over_a_full_rate_window(
    since: std::time::Instant,
) -> impl Fn(&backpressure_api::v1alpha1::WorkerBackpressureStatus) -> bool {
    use backpressure_api::v1alpha1::Regime;

    // The scene's rate window is 5 s; a rate over a window that began before the consumer's
    // first acknowledgement is low (a cold CI run read 1 delivery a second of 2, and the
    // age estimate twice what it is). Three windows after traffic started, every rate is over
    // steady traffic.
    const STEADY: std::time::Duration = std::time::Duration::from_secs(15);
    move |s| {
        since.elapsed() >= STEADY
            && s.regime == Some(Regime::Backlogged)
            && s.replicas.as_ref().is_some_and(|r| r.desired > 2)
            && s.fleet
                .as_ref()
                .and_then(|f| f.arrival_rate)
                .is_some_and(|a| a >= 3.0)
    }
}

/// The queue's series are gone (the exporter stopped, or its scrape target removed): the object
/// reports MetricsUnavailable naming the queue, and the target's replicas stay where they are.
async fn queue_metrics_unavailable_keep_replicas(w: &crate::common::world::World, what: &str) {
    use std::time::Duration;

    use backpressure_api::conditions as cond;
    use backpressure_api::v1alpha1::Regime;

    use crate::common::scene::{condition, has_condition};

    let s = w
        .wait_status(Duration::from_secs(40), what, |s| {
            s.regime == Some(Regime::MetricsUnavailable)
                && has_condition(s, cond::METRICS_AVAILABLE, "False")
        })
        .await;
    let held = w.scene.replicas("w").await;
    for _ in 0..8 {
        assert_eq!(
            w.scene.replicas("w").await,
            held,
            "replicas changed without queue metrics"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert!(c.message.contains("queue"), "{}", c.message);
}

/// The queue's series are back: metrics are available again.
async fn queue_metrics_again(w: &crate::common::world::World) {
    use std::time::Duration;

    use backpressure_api::conditions as cond;
    use backpressure_api::v1alpha1::Regime;

    use crate::common::scene::has_condition;

    w.wait_status(Duration::from_secs(40), "queue metrics again", |s| {
        has_condition(s, cond::METRICS_AVAILABLE, "True")
            && s.regime.is_some_and(|r| r != Regime::MetricsUnavailable)
    })
    .await;
}

/// The Redis Streams preset end to end: a real redis-server with stream `orders` and consumer
/// group `workers`, a real redis_exporter, a real Prometheus scraping it (and the workers'
/// backoff from the fake fleet), and the operator reading the queue only through
/// `spec.queue`. Entries arrive faster than the group consumes them: the object reports the
/// group's lag as depth and the age of the waiting entries, and scales the target out. The
/// exporter goes away: the queue's series go stale (Prometheus marks a failed target's series
/// stale), the object reports MetricsUnavailable and keeps its replicas; the exporter is back:
/// metrics again.
#[tokio::test]
async fn redis_streams_preset_sizes_the_target_from_a_real_stream() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use backpressure_api::conditions as cond;

    use crate::common::fleet::steady;
    use crate::common::scene::condition;
    use crate::common::serial;
    use crate::common::world::World;

    let _serial = serial().await;
    let mut w = World::builder("redispreset").replicas(2).start().await;
    w.fleet.set(steady);
    let dir = std::env::temp_dir().join(format!(
        "bp-redis-preset-{}",
        backpressure_envtest::unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = Arc::new(Redis::start(&dir));
    redis.cli(&["XGROUP", "CREATE", "orders", "workers", "$", "MKSTREAM"]);
    let exporter_port = backpressure_envtest::process::free_port().unwrap();
    let mut exporter = redis_exporter(&redis, exporter_port, &dir);
    let exporter_target = backpressure_envtest::ScrapeTarget {
        address: format!("127.0.0.1:{exporter_port}"),
        labels: std::collections::BTreeMap::from([("namespace".to_owned(), w.scene.ns.clone())]),
    };
    w.prom
        .set_targets(&[w.fleet.target(), exporter_target])
        .unwrap();

    // 5 entries a second arrive, the group reads and acknowledges 2.
    let running = Arc::new(AtomicBool::new(true));
    let traffic = {
        let (redis, running) = (redis.clone(), running.clone());
        std::thread::spawn(move || {
            while running.load(Ordering::Relaxed) {
                redis.cli(&[
                    "EVAL",
                    "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', 'orders', '*', 'body', 'x') end return 0",
                    "0",
                    "5",
                ]);
                redis.cli(&[
                    "EVAL",
                    "local r = redis.call('XREADGROUP', 'GROUP', 'workers', 'c1', 'COUNT', ARGV[1], 'STREAMS', 'orders', '>') \
                     if r then for _, e in ipairs(r[1][2]) do redis.call('XACK', 'orders', 'workers', e[1]) end end return 0",
                    "0",
                    "2",
                ]);
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let started = Instant::now();
    w.prom
        .wait_for_series("redis_stream_group_lag", Duration::from_secs(30))
        .unwrap();

    w.apply(json!({
        "queue": {"system": "RedisStreams", "redisStreams": {"stream": "orders", "consumerGroup": "workers"}},
    }))
    .await;
    w.start_operator().await;

    // The queue as Redis has it, through the preset: depth is the group's lag, the age grows
    // with the oldest waiting entry, and the target is scaled out for it.
    let s = w
        .wait_status(
            Duration::from_secs(150),
            "scaled out for the stream's backlog, with rates over a whole window",
            scaled_out_over_a_full_rate_window(started),
        )
        .await;
    let fleet = s.fleet.clone().unwrap_or_default();
    let lag: f64 = redis
        .cli(&["XINFO", "GROUPS", "orders"])
        .lines()
        .skip_while(|l| l.trim() != "lag")
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let depth = fleet.queue_depth.unwrap();
    assert!(
        depth > 10.0 && (depth - lag).abs() <= 0.5 * lag,
        "depth {depth} should be the group's lag ({lag} now)"
    );
    let age = fleet.queue_age.unwrap();
    assert!(
        age > 10.0 && age <= started.elapsed().as_secs_f64() + 2.0,
        "age {age}: the oldest waiting entry is older than the target and younger than the test ({:?})",
        started.elapsed()
    );
    let arrival = fleet.arrival_rate.unwrap();
    let completion = fleet.completion_rate.unwrap();
    assert!(
        (3.0..=8.0).contains(&arrival),
        "arrivals {arrival}/s, 5/s added"
    );
    assert!(
        (1.0..=3.5).contains(&completion),
        "completions {completion}/s, 2/s acked"
    );
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert_eq!(c.status, "True", "{}", c.message);

    // The exporter goes away: its series are stale, the queue is unknown.
    exporter.stop();
    queue_metrics_unavailable_keep_replicas(&w, "MetricsUnavailable without the exporter").await;

    let _exporter = redis_exporter(&redis, exporter_port, &dir);
    queue_metrics_again(&w).await;
    running.store(false, Ordering::Relaxed);
    traffic.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Serves `metrics` as a Prometheus text exposition on `127.0.0.1:port` until aborted.
async fn serve_metrics(
    port: u16,
    metrics: backpressure_worker::metrics::Metrics,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let body = metrics.encode();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    })
}

/// The SQS preset end to end, without CloudWatch: a real SQS-compatible server (moto,
/// `tools/sqs/moto.sh`), a producer sending 5 messages a second, an in-process consumer (the
/// worker library's SQS source in a `WorkerLoop`, 2 permits, 1 s a message: at most 2 a second) whose
/// metrics endpoint exports the queue's depth (`GetQueueAttributes`), deletes and first
/// receives, a real Prometheus scraping it, and the operator reading the queue only through
/// `spec.queue: {system: SQS, sqs: {exporter: Worker}}`. The backlog grows: the object reports
/// the queue's depth and the rates and scales the target out. The endpoint goes away:
/// MetricsUnavailable, replicas kept; it is back: metrics again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_preset_sizes_the_target_from_a_real_queue() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use backpressure_api::conditions as cond;
    use backpressure_api::v1alpha1::Algorithm;
    use backpressure_api::wire::WorkerConfig;
    use backpressure_envtest::sqs::{ACCESS_KEY_ID, Moto, REGION, SECRET_ACCESS_KEY};
    use backpressure_worker::controller::{self, Outcome, Settings};
    use backpressure_worker::metrics::{Metrics, Parts};
    use backpressure_worker::permits::Gate;
    use backpressure_worker::sources::sqs::{Credentials, SqsClient, SqsMessage, SqsSource};
    use backpressure_worker::worker_loop::{Handler, WorkerLoop};

    use crate::common::fleet::steady;
    use crate::common::scene::condition;
    use crate::common::serial;
    use crate::common::world::{W, World};

    struct OneSecond;
    impl Handler<SqsMessage> for OneSecond {
        async fn handle(&self, _m: &SqsMessage) -> Outcome {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Outcome::Success
        }
    }

    let _serial = serial().await;
    let mut w = World::builder("sqspreset").replicas(2).start().await;
    w.fleet.set(steady);
    let dir =
        std::env::temp_dir().join(format!("bp-sqs-preset-{}", backpressure_envtest::unique()));
    std::fs::create_dir_all(&dir).unwrap();
    let moto = Moto::start(&dir).unwrap();
    let sqs = SqsClient::new(
        &moto.endpoint(),
        REGION,
        Credentials {
            access_key_id: ACCESS_KEY_ID.into(),
            secret_access_key: SECRET_ACCESS_KEY.into(),
            session_token: None,
        },
    )
    .unwrap();
    let url = sqs
        .create_queue(
            "orders",
            &BTreeMap::from([("VisibilityTimeout".to_owned(), "30".to_owned())]),
        )
        .await
        .unwrap();

    // The consumer: the library's source and loop, its queue series on a metrics endpoint.
    let source = Arc::new(SqsSource::new(sqs.clone(), url.clone()));
    let metrics = Metrics::with_parts(
        W,
        Parts {
            worker: false,
            producer: false,
        },
        |r| source.metrics().register(r, "orders"),
    );
    let depth_watch = tokio::spawn(source.clone().watch_depth(Duration::from_secs(1)));
    let settings = Settings::from_config(&WorkerConfig {
        algorithm: Algorithm::Fixed,
        max_permits: 2,
        initial_permits: Some(2),
        ..WorkerConfig::default()
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let consumer = tokio::spawn(
        WorkerLoop::new(
            source.clone(),
            Arc::new(OneSecond),
            Gate::new(controller::build(settings, 1)),
        )
        .run(async move {
            let _ = stop_rx.await;
        }),
    );
    let port = backpressure_envtest::process::free_port().unwrap();
    let endpoint = serve_metrics(port, metrics.clone()).await;
    let target = backpressure_envtest::ScrapeTarget {
        address: format!("127.0.0.1:{port}"),
        labels: BTreeMap::from([("namespace".to_owned(), w.scene.ns.clone())]),
    };
    w.prom.set_targets(&[w.fleet.target(), target]).unwrap();

    // 5 messages a second arrive.
    let producer = {
        let (sqs, url) = (sqs.clone(), url.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                for _ in 0..5 {
                    sqs.send_message(&url, "x").await.unwrap();
                }
            }
        })
    };
    let started = Instant::now();
    w.prom
        .wait_for_series("backpressure_queue_depth", Duration::from_secs(30))
        .unwrap();

    w.apply(json!({
        "queue": {"system": "SQS", "sqs": {"queue": "orders", "exporter": "Worker"}},
    }))
    .await;
    w.start_operator().await;

    let s = w
        .wait_status(
            Duration::from_secs(150),
            "scaled out for the queue's backlog, with rates over a whole window",
            scaled_out_over_a_full_rate_window(started),
        )
        .await;
    let fleet = s.fleet.clone().unwrap_or_default();
    let visible = source.poll_depth().await.unwrap() as f64;
    eprintln!(
        "sqs preset: depth {:?} (SQS: {visible}), arrivals {:?}/s, completions {:?}/s, age {:?} s, desired {:?}",
        fleet.queue_depth,
        fleet.arrival_rate,
        fleet.completion_rate,
        fleet.queue_age,
        s.replicas.as_ref().map(|r| r.desired)
    );
    let depth = fleet.queue_depth.unwrap();
    assert!(
        depth > 10.0 && (depth - visible).abs() <= 0.5 * visible,
        "depth {depth} should be the queue's ApproximateNumberOfMessages ({visible} now)"
    );
    let arrival = fleet.arrival_rate.unwrap();
    let completion = fleet.completion_rate.unwrap();
    assert!(
        (3.0..=8.0).contains(&arrival),
        "arrivals {arrival}/s, 5/s sent"
    );
    // At most 2/s (2 permits, 1 s a message); against moto the loop finishes about 1.3/s
    // (one message per receive, each receive a round trip), and the first seconds are in the
    // rate window: 0.9 to 1.2/s seen about 15 s in.
    assert!(
        (0.5..=3.0).contains(&completion),
        "completions {completion}/s, at most 2/s deleted"
    );
    // The estimate: the visible messages at the rate they are first received (0.5 to 3/s,
    // as the completions).
    let age = fleet.queue_age.unwrap();
    assert!(
        age.is_finite() && age > depth / 3.5 && age < depth / 0.4,
        "age {age}: depth {depth} at 0.5 to 3 first receives a second"
    );
    assert!(source.metrics().completions() > 0);
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert_eq!(c.status, "True", "{}", c.message);

    // The metrics endpoint goes away: the queue's series are stale, the queue is unknown.
    endpoint.abort();
    let _ = endpoint.await;
    queue_metrics_unavailable_keep_replicas(&w, "MetricsUnavailable without the metrics endpoint")
        .await;

    let endpoint = serve_metrics(port, metrics.clone()).await;
    queue_metrics_again(&w).await;
    producer.abort();
    depth_watch.abort();
    endpoint.abort();
    stop_tx.send(()).unwrap();
    let stats = consumer.await.unwrap();
    eprintln!("sqs preset: consumer {stats:?}");
    assert_eq!(stats.settle_errors, 0, "{stats:?}");
    drop(moto);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The RabbitMQ preset end to end: a real RabbitMQ (Debian's `rabbitmq-server` 3.10, started by
/// `backpressure_envtest::RabbitMq`) with queue `orders`, its own Prometheus plugin scraped by a
/// real Prometheus on `/metrics/detailed` (the families 3.x has: `queue_coarse_metrics`,
/// `channel_queue_metrics`, `channel_queue_exchange_metrics`), a consumer that is the worker
/// library's `RabbitMqSource` under a `WorkerLoop` (in-process, one permit), and the operator
/// reading the queue only through `spec.queue`. Messages are published faster than the consumer
/// acks them: the object reports the ready messages as depth, the publish and ack rates, an
/// estimated age, and scales the target out. The plugin's scrape targets go away: the queue's
/// series go stale, the object reports MetricsUnavailable and keeps its replicas; they are back:
/// metrics again.
#[tokio::test]
async fn rabbitmq_preset_sizes_the_target_from_a_real_queue() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use backpressure_api::conditions as cond;
    use backpressure_worker::controller::{self, Algorithm, Outcome, Settings};
    use backpressure_worker::permits::Gate;
    use backpressure_worker::sources::rabbitmq::lapin::options::{
        BasicPublishOptions, QueueDeclareOptions,
    };
    use backpressure_worker::sources::rabbitmq::lapin::types::FieldTable;
    use backpressure_worker::sources::rabbitmq::lapin::{
        BasicProperties, Channel, Connection, ConnectionProperties,
    };
    use backpressure_worker::sources::rabbitmq::{RabbitMqMessage, RabbitMqSource};
    use backpressure_worker::worker_loop::{Handler, WorkerLoop};

    use crate::common::fleet::steady;
    use crate::common::scene::condition;
    use crate::common::serial;
    use crate::common::world::World;

    /// Takes 0.5 s per message: 2 a second with one permit.
    struct Slow;
    impl Handler<RabbitMqMessage> for Slow {
        async fn handle(&self, _m: &RabbitMqMessage) -> Outcome {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Outcome::Success
        }
    }

    async fn ready(ch: &Channel) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare("orders".into(), passive, FieldTable::default())
            .await
            .unwrap()
            .message_count()
    }

    let _serial = serial().await;
    let mut w = World::builder("rabbitpreset").replicas(2).start().await;
    w.fleet.set(steady);
    let t0 = Instant::now();
    let broker = tokio::task::spawn_blocking(backpressure_envtest::RabbitMq::start)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "rabbitmq-server ready in {:?} ({:?} with the spawn)",
        broker.start_time(),
        t0.elapsed()
    );
    // The broker's clients run on a runtime of their own: this test's (current-thread) runtime
    // blocks in the Prometheus helper's waits.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let uri = broker.amqp_uri();
    let (conn, ch) = rt
        .spawn(async move {
            let conn = Connection::connect(&uri, ConnectionProperties::default())
                .await
                .unwrap();
            let ch = conn.create_channel().await.unwrap();
            (conn, ch)
        })
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare("orders".into(), durable, FieldTable::default())
        .await
        .unwrap();

    // The plugin's per-queue and per-channel families, one scrape target each (a target
    // carries one value per URL parameter).
    let ns = w.scene.ns.clone();
    let rabbit_targets: Vec<backpressure_envtest::ScrapeTarget> = [
        "queue_coarse_metrics",
        "channel_queue_metrics",
        "channel_queue_exchange_metrics",
    ]
    .into_iter()
    .map(|family| {
        backpressure_envtest::ScrapeTarget::new(broker.prometheus_address())
            .label("namespace", &ns)
            .metrics_path("/metrics/detailed")
            .param("family", family)
    })
    .collect();
    let fleet_target = w.fleet.target();
    let with_rabbit = || {
        let mut t = vec![fleet_target.clone()];
        t.extend(rabbit_targets.iter().cloned());
        t
    };
    w.prom.set_targets(&with_rabbit()).unwrap();

    // 5 messages a second are published; the worker acks 2.
    let publisher = {
        let ch = ch.clone();
        rt.spawn(async move {
            loop {
                for _ in 0..5 {
                    ch.basic_publish(
                        "".into(),
                        "orders".into(),
                        BasicPublishOptions::default(),
                        b"order",
                        BasicProperties::default(),
                    )
                    .await
                    .unwrap();
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let gate = Gate::new(controller::build(
        Settings {
            algorithm: Algorithm::Fixed,
            max_permits: 1,
            initial_permits: 0,
            ..Settings::default()
        },
        1,
    ));
    let source = Arc::new(RabbitMqSource::new(broker.amqp_uri(), "orders"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let consumer = rt.spawn(
        WorkerLoop::new(source, Arc::new(Slow), gate)
            .no_redelivery_backoff()
            .run(async move {
                let _ = stop_rx.await;
            }),
    );
    let started = Instant::now();
    w.prom
        .wait_for_series(
            r#"rabbitmq_detailed_channel_get_ack_total{queue="orders"}"#,
            Duration::from_secs(30),
        )
        .unwrap();

    w.apply(json!({
        "queue": {"system": "RabbitMQ", "rabbitMQ": {"queue": "orders"}},
    }))
    .await;
    w.start_operator().await;

    let s = w
        .wait_status(
            Duration::from_secs(150),
            "scaled out for the queue's backlog, with rates over a whole window",
            scaled_out_over_a_full_rate_window(started),
        )
        .await;
    let fleet = s.fleet.clone().unwrap_or_default();
    let now_ready = f64::from(ready(&ch).await);
    let depth = fleet.queue_depth.unwrap();
    // The ready count only grows (5 in, 2 out a second) and the status is a few seconds old:
    // the depth is what the broker had ready then, at most what it has now.
    assert!(
        depth > 10.0 && depth <= now_ready + 1.0,
        "depth {depth} should be the ready messages ({now_ready} now)"
    );
    let arrival = fleet.arrival_rate.unwrap();
    let completion = fleet.completion_rate.unwrap();
    assert!(
        (3.0..=8.0).contains(&arrival),
        "arrivals {arrival}/s, 5/s published"
    );
    assert!(
        (1.0..=3.0).contains(&completion),
        "completions {completion}/s, 2/s acked"
    );
    // The estimate: the ready messages at the delivery rate (about 2/s).
    let age = fleet.queue_age.unwrap();
    assert!(
        age > 5.0 && (age - depth / 2.0).abs() <= 0.5 * depth / 2.0,
        "age {age}: depth {depth} at about 2 deliveries a second ({:?} in)",
        started.elapsed()
    );
    eprintln!(
        "rabbitmq preset: depth {depth} (ready {now_ready}), age {age:.1} s, arrivals {arrival:.2}/s, completions {completion:.2}/s after {:?}",
        started.elapsed()
    );
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert_eq!(c.status, "True", "{}", c.message);

    // The plugin's targets go away: their series are stale, the queue is unknown.
    w.prom
        .set_targets(std::slice::from_ref(&fleet_target))
        .unwrap();
    queue_metrics_unavailable_keep_replicas(&w, "MetricsUnavailable without the broker's metrics")
        .await;

    w.prom.set_targets(&with_rabbit()).unwrap();
    queue_metrics_again(&w).await;
    publisher.abort();
    let _ = stop_tx.send(());
    let stats = consumer.await.unwrap();
    assert_eq!(stats.settle_errors, 0, "{stats:?}");
    assert!(stats.outcomes[Outcome::Success.index()] > 10, "{stats:?}");
    let _ = conn.close(200, "done".into()).await;
    rt.shutdown_background();
    drop(broker);
}
