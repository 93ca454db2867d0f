//! The generated CRDs against a real kube-apiserver: accepted and Established, the sample object
//! round-trips, `kubectl get wbp` columns come from the printer columns, status is written
//! through the status subresource, and invalid objects are rejected with the field named.

use backpressure_api::v1alpha1::{
    BackpressurePolicy, Regime, ReplicaStatus, WorkerBackpressure, WorkerBackpressureStatus,
};
use backpressure_envtest::TestEnv;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::crds::install_crds;
use crate::common::serial;

fn sample() -> WorkerBackpressure {
    let path = backpressure_envtest::repo_root()
        .join("config/samples/backpressure_v1alpha1_workerbackpressure.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap()
}

#[tokio::test]
async fn sample_is_accepted_listed_with_columns_and_status_is_writable() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let ns = env.namespace("crd").await.unwrap();
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &ns);

    let mut wbp = sample();
    wbp.metadata.namespace = None;
    let created = api.create(&PostParams::default(), &wbp).await.unwrap();
    assert_eq!(
        created.spec, wbp.spec,
        "the stored spec must equal the sample"
    );

    // Status through the status subresource.
    let status = WorkerBackpressureStatus {
        observed_generation: created.metadata.generation,
        regime: Some(Regime::DependencyFailing),
        replicas: Some(ReplicaStatus {
            current: 8,
            desired: 8,
            recommended: 14,
        }),
        conditions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Reconciled".into(),
                message: "regime DependencyFailing: desired 8 replicas".into(),
                observed_generation: created.metadata.generation,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
            },
        ]),
        ..Default::default()
    };
    let name = created.metadata.name.clone().unwrap();
    let patch = json!({"apiVersion": "backpressure.dev/v1alpha1", "kind": "WorkerBackpressure", "status": status});
    api.patch_status(
        &name,
        &PatchParams::apply("crd-test").force(),
        &Patch::Apply(&patch),
    )
    .await
    .unwrap();
    let got = api.get_status(&name).await.unwrap();
    assert_eq!(
        got.status.as_ref().unwrap().regime,
        Some(Regime::DependencyFailing)
    );
    // A spec change through the status subresource is ignored.
    assert_eq!(got.spec, wbp.spec);

    // `kubectl get wbp` asks for a Table; the columns come from the CRD's printer columns.
    let req = http::Request::get(format!(
        "/apis/backpressure.dev/v1alpha1/namespaces/{ns}/workerbackpressures"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for want in [
        "Name",
        "Target",
        "Ready",
        "Regime",
        "Replicas",
        "Backoff",
        "Queue Age",
    ] {
        assert!(
            columns.contains(&want),
            "column {want} missing from {columns:?}"
        );
    }
    let row = &table["rows"][0]["cells"];
    let col = |n: &str| row[columns.iter().position(|c| *c == n).unwrap()].clone();
    assert_eq!(col("Name"), json!(name));
    assert_eq!(col("Target"), json!(wbp.spec.target_ref.name));
    assert_eq!(col("Regime"), json!("DependencyFailing"));
    assert_eq!(col("Replicas"), json!(8));
    assert_eq!(col("Ready"), json!("True"));

    // The short name resolves through discovery, as `kubectl get wbp` does.
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let found = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .any(|(ar, _)| ar.kind == "WorkerBackpressure" && ar.plural == "workerbackpressures");
    assert!(found, "WorkerBackpressure not discoverable");
    let raw = http::Request::get("/apis/backpressure.dev/v1alpha1")
        .body(Vec::new())
        .unwrap();
    let list: Value = serde_json::from_str(&client.request_text(raw).await.unwrap()).unwrap();
    let wbp_res = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "workerbackpressures")
        .unwrap();
    assert_eq!(wbp_res["shortNames"], json!(["wbp"]));
}

/// Builds a minimal valid object and applies `mutate` to its JSON.
fn object(name: &str, mutate: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
            "worker": {},
            "scaling": {"hold": {}, "release": {}, "rampUp": {}},
        }
    });
    mutate(&mut v);
    v
}

#[tokio::test]
async fn invalid_objects_are_rejected_naming_the_field() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let ns = env.namespace("invalid").await.unwrap();
    let ar = kube::discovery::ApiResource::erase::<WorkerBackpressure>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);

    // The minimal object itself is valid.
    let ok: DynamicObject = serde_json::from_value(object("valid", |_| {})).unwrap();
    api.create(&PostParams::default(), &ok).await.unwrap();

    type Case = (&'static str, fn(&mut Value), &'static str);
    let cases: Vec<Case> = vec![
        (
            "max-below-min",
            |v| {
                v["spec"]["scaling"]["minReplicas"] = json!(5);
                v["spec"]["scaling"]["maxReplicas"] = json!(3);
            },
            "spec.scaling.minReplicas",
        ),
        (
            "min-above-default-max",
            |v| {
                v["spec"]["scaling"]["minReplicas"] = json!(11);
            },
            "spec.scaling.minReplicas",
        ),
        (
            "setpoint-zero",
            |v| {
                v["spec"]["worker"]["setPoint"] = json!(0);
            },
            "spec.worker.setPoint",
        ),
        (
            "setpoint-above-one",
            |v| {
                v["spec"]["worker"]["setPoint"] = json!(1.5);
            },
            "spec.worker.setPoint",
        ),
        (
            "stages-unsorted",
            |v| {
                v["spec"]["scaling"]["rampUp"]["stages"] = json!([50, 25, 100]);
            },
            "spec.scaling.rampUp.stages",
        ),
        (
            "stages-not-100",
            |v| {
                v["spec"]["scaling"]["rampUp"]["stages"] = json!([25, 50, 75]);
            },
            "spec.scaling.rampUp.stages",
        ),
        (
            "stages-duplicate",
            |v| {
                v["spec"]["scaling"]["rampUp"]["stages"] = json!([50, 50, 100]);
            },
            "spec.scaling.rampUp.stages",
        ),
        (
            "stage-above-100",
            |v| {
                v["spec"]["scaling"]["rampUp"]["stages"] = json!([50, 150]);
            },
            "spec.scaling.rampUp.stages",
        ),
        (
            "release-above-hold",
            |v| {
                v["spec"]["scaling"]["hold"]["backoffAbove"] = json!(0.2);
                v["spec"]["scaling"]["release"]["backoffBelow"] = json!(0.3);
            },
            "spec.scaling.release.backoffBelow",
        ),
        (
            "release-equals-default-hold",
            |v| {
                v["spec"]["scaling"]["release"]["backoffBelow"] = json!(0.2);
            },
            "spec.scaling.release.backoffBelow",
        ),
        (
            "negative-duration",
            |v| {
                v["spec"]["scaling"]["hold"]["for"] = json!("-30s");
            },
            "spec.scaling.hold.for",
        ),
        (
            "duration-without-unit",
            |v| {
                v["spec"]["scaling"]["targetQueueAge"] = json!("60");
            },
            "spec.scaling.targetQueueAge",
        ),
        (
            "unknown-mode",
            |v| {
                v["spec"]["mode"] = json!("Aggressive");
            },
            "spec.mode",
        ),
        (
            "guard-without-ref",
            |v| {
                v["spec"]["mode"] = json!("Guard");
            },
            "spec.guard",
        ),
        (
            "static-fallback-without-replicas",
            |v| {
                v["spec"]["scaling"]["onMetricsUnavailable"] = json!({"policy": "Static"});
            },
            "spec.scaling.onMetricsUnavailable.replicas",
        ),
        (
            "missing-target",
            |v| {
                v["spec"].as_object_mut().unwrap().remove("targetRef");
            },
            "spec.targetRef",
        ),
        (
            "probe-initial-above-max",
            |v| {
                v["spec"]["worker"]["probe"] =
                    json!({"initialInterval": "2m", "maxInterval": "1m"});
            },
            "spec.worker.probe.initialInterval",
        ),
        (
            "setpoint-tiny",
            |v| {
                v["spec"]["worker"]["setPoint"] = json!(1e-12);
            },
            "spec.worker.setPoint",
        ),
        (
            "dwell-forever",
            |v| {
                v["spec"]["scaling"]["rampUp"]["dwell"] = json!("100000h");
            },
            "spec.scaling.rampUp.dwell",
        ),
        (
            "hold-for-over-a-day",
            |v| {
                v["spec"]["scaling"]["hold"]["for"] = json!("24h1s");
            },
            "spec.scaling.hold.for",
        ),
        (
            "release-for-over-a-day",
            |v| {
                v["spec"]["scaling"]["release"]["for"] = json!("1441m");
            },
            "spec.scaling.release.for",
        ),
        (
            "stabilization-over-a-day",
            |v| {
                v["spec"]["scaling"]["scaleDown"] = json!({"stabilization": "48h"});
            },
            "spec.scaling.scaleDown.stabilization",
        ),
        (
            "probe-max-over-a-day",
            |v| {
                v["spec"]["worker"]["probe"] = json!({"maxInterval": "25h"});
            },
            "spec.worker.probe.maxInterval",
        ),
        (
            "non-http-prometheus",
            |v| {
                v["spec"]["metrics"] = json!({"prometheus": {"address": "ftp://x"}});
            },
            "spec.metrics.prometheus.address",
        ),
    ];
    let mut failures = Vec::new();
    for (name, mutate, field) in cases {
        let obj: DynamicObject = serde_json::from_value(object(name, mutate)).unwrap();
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => failures.push(format!(
                "{name}: accepted, expected rejection naming {field}"
            )),
            Err(kube::Error::Api(s)) => {
                if s.code != 422 || !s.message.contains(field) {
                    failures.push(format!(
                        "{name}: HTTP {} {:?} does not name {field}",
                        s.code, s.message
                    ));
                }
            }
            Err(e) => failures.push(format!("{name}: unexpected error {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The bounds are inclusive: a day and the smallest set point are accepted.
    let edge: DynamicObject = serde_json::from_value(object("edge", |v| {
        v["spec"]["worker"]["setPoint"] = json!(0.0001);
        v["spec"]["scaling"]["rampUp"]["dwell"] = json!("24h");
        v["spec"]["scaling"]["hold"]["for"] = json!("1440m");
    }))
    .unwrap();
    api.create(&PostParams::default(), &edge).await.unwrap();
}

/// A BackpressurePolicy brake throttles every matched worker: it must name when it lifts
/// itself (`expiresAt`), and the rejection names the field.
#[tokio::test]
async fn a_brake_without_expiry_is_rejected_naming_the_field() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let ar = kube::discovery::ApiResource::erase::<BackpressurePolicy>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let policy = |name: &str, brake: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "backpressure.dev/v1alpha1",
            "kind": "BackpressurePolicy",
            "metadata": {"name": name},
            "spec": {"brake": brake},
        }))
        .unwrap()
    };
    let err = api
        .create(
            &PostParams::default(),
            &policy("brake-forever", json!({"minBackoff": 0.5})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.brake.expiresAt")),
        "{err:?}"
    );
    let ok = policy(
        "brake-expiring",
        json!({"minBackoff": 0.5, "expiresAt": "2030-01-01T00:00:00Z"}),
    );
    api.create(&PostParams::default(), &ok).await.unwrap();
    api.delete("brake-expiring", &Default::default())
        .await
        .unwrap();
}

/// `spec.producers`: inverted watermarks, producers without a workload, and a policy that names
/// producers are rejected at admission naming the field; a complete section is accepted.
#[tokio::test]
async fn producer_watermarks_are_validated_naming_the_field() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let ns = env.namespace("producers-crd").await.unwrap();
    let ar = kube::discovery::ApiResource::erase::<WorkerBackpressure>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let producer = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"});
    let with = |name: &str, producers: Value| -> DynamicObject {
        serde_json::from_value(object(name, |v| v["spec"]["producers"] = producers)).unwrap()
    };
    let cases = [
        (
            "depth-inverted",
            json!({"targetRef": producer, "queueDepth": {"pauseAbove": 100, "resumeBelow": 100}}),
            "spec.producers.queueDepth.resumeBelow",
        ),
        (
            "age-inverted",
            json!({"targetRef": producer, "queueAge": {"pauseAbove": "1m", "resumeBelow": "5m"}}),
            "spec.producers.queueAge.resumeBelow",
        ),
        (
            "no-target",
            json!({"mode": "Pause", "queueDepth": {"pauseAbove": 100, "resumeBelow": 10}}),
            "spec.producers.targetRef",
        ),
        (
            "dwell-zero",
            json!({"targetRef": producer, "queueDepth": {"pauseAbove": 100, "resumeBelow": 10}, "resumeDwell": "0s"}),
            "spec.producers.resumeDwell",
        ),
    ];
    let mut failures = Vec::new();
    for (name, producers, field) in cases {
        match api
            .create(&PostParams::default(), &with(name, producers))
            .await
        {
            Ok(_) => failures.push(format!("{name}: accepted, expected {field}")),
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(field) => {}
            Err(e) => failures.push(format!("{name}: {e} does not name {field}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (name, producers) in [
        (
            "complete",
            json!({"targetRef": producer, "mode": "Throttle",
                   "queueDepth": {"pauseAbove": 100, "resumeBelow": 10},
                   "queueAge": {"pauseAbove": "10m", "resumeBelow": "2m"}}),
        ),
        ("off", json!({"mode": "Off"})),
    ] {
        api.create(&PostParams::default(), &with(name, producers))
            .await
            .unwrap();
    }

    let par = kube::discovery::ApiResource::erase::<BackpressurePolicy>(&());
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &par);
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "BackpressurePolicy",
        "metadata": {"name": "names-producers"},
        "spec": {"defaults": {"producers": {"targetRef": producer}}},
    }))
    .unwrap();
    let err = policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.defaults.producers.targetRef")),
        "{err:?}"
    );
}

/// `spec.queue`: a system without its section, a section of another system, names a preset
/// cannot read, and out-of-range values are rejected at admission naming the field; a complete
/// section of every system is accepted, and a policy may default the exporter's scrape.
#[tokio::test]
async fn queue_presets_are_validated_naming_the_field() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let ns = env.namespace("queue-crd").await.unwrap();
    let ar = kube::discovery::ApiResource::erase::<WorkerBackpressure>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let with = |name: &str, queue: Value| -> DynamicObject {
        serde_json::from_value(object(name, |v| v["spec"]["queue"] = queue)).unwrap()
    };
    let kafka = json!({"topic": "orders", "consumerGroup": "workers"});
    let cases = [
        ("no-section", json!({"system": "Kafka"}), "spec.queue.kafka"),
        (
            "other-section",
            json!({"system": "Custom", "redisStreams": {"stream": "s", "consumerGroup": "g"}}),
            "spec.queue.redisStreams",
        ),
        (
            "two-sections",
            json!({"system": "Kafka", "kafka": kafka, "sqs": {"queue": "orders"}}),
            "spec.queue.sqs",
        ),
        (
            "unknown-system",
            json!({"system": "Nats"}),
            "spec.queue.system",
        ),
        (
            "sqs-name",
            json!({"system": "SQS", "sqs": {"queue": "orders\"} or x{a=\""}}),
            "spec.queue.sqs.queue",
        ),
        (
            "sqs-period",
            json!({"system": "SQS", "sqs": {"queue": "orders", "period": "10s"}}),
            "spec.queue.sqs.period",
        ),
        (
            "kafka-topic",
            json!({"system": "Kafka", "kafka": {"topic": "a b", "consumerGroup": "g"}}),
            "spec.queue.kafka.topic",
        ),
        (
            "kafka-partitions",
            json!({"system": "Kafka", "kafka": {"topic": "t", "consumerGroup": "g", "partitions": 0}}),
            "spec.queue.kafka.partitions",
        ),
        (
            "redis-control",
            json!({"system": "RedisStreams", "redisStreams": {"stream": "a\nb", "consumerGroup": "g"}}),
            "spec.queue.redisStreams.stream",
        ),
        (
            "rabbit-empty",
            json!({"system": "RabbitMQ", "rabbitMQ": {"queue": ""}}),
            "spec.queue.rabbitMQ.queue",
        ),
        (
            "pubsub-project",
            json!({"system": "PubSub", "pubSub": {"subscription": "orders-sub", "project": "X"}}),
            "spec.queue.pubSub.project",
        ),
        (
            "stale-zero",
            json!({"system": "Kafka", "kafka": kafka, "staleAfter": "0s"}),
            "spec.queue.staleAfter",
        ),
        (
            "job-control",
            json!({"system": "Kafka", "kafka": kafka, "exporter": {"job": "a\u{7}"}}),
            "spec.queue.exporter.job",
        ),
    ];
    let mut failures = Vec::new();
    for (name, queue, field) in cases {
        match api.create(&PostParams::default(), &with(name, queue)).await {
            Ok(_) => failures.push(format!("{name}: accepted, expected {field}")),
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains(field) => {}
            Err(e) => failures.push(format!("{name}: {e} does not name {field}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (name, queue) in [
        (
            "redis",
            json!({"system": "RedisStreams", "redisStreams": {"stream": "orders", "consumerGroup": "workers", "db": 2}}),
        ),
        (
            "rabbit",
            json!({"system": "RabbitMQ", "rabbitMQ": {"queue": "orders", "vhost": "/shop"}}),
        ),
        (
            "sqs",
            json!({"system": "SQS", "sqs": {"queue": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", "exporter": "CloudWatchExporter", "period": "5m"}}),
        ),
        (
            "sqs-worker",
            json!({"system": "SQS", "sqs": {"queue": "orders", "exporter": "Worker"}}),
        ),
        (
            "kafka",
            json!({"system": "Kafka", "kafka": {"topic": "orders.v1", "consumerGroup": "workers", "exporter": "KMinion", "partitions": 12}, "exporter": {"job": "kminion"}, "staleAfter": "2m"}),
        ),
        (
            "pubsub",
            json!({"system": "PubSub", "pubSub": {"subscription": "projects/shop-prod/subscriptions/orders-workers"}}),
        ),
        ("custom", json!({"system": "Custom"})),
    ] {
        if let Err(e) = api.create(&PostParams::default(), &with(name, queue)).await {
            failures.push(format!("{name}: rejected: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let par = kube::discovery::ApiResource::erase::<BackpressurePolicy>(&());
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &par);
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "BackpressurePolicy",
        "metadata": {"name": "queue-defaults"},
        "spec": {
            "defaults": {"queue": {"exporter": {"job": "yace"}, "staleAfter": "5m"}},
            "limits": {"allowedQueueSystems": ["SQS", "Custom"]},
        },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    policies
        .delete("queue-defaults", &Default::default())
        .await
        .unwrap();
}
