//! What a tenant can read or reach through `spec.metrics`: another team's Secrets (sent to an
//! address of the tenant's choosing), another namespace's series (a query that relabels them),
//! the operator's network position (any address fetched), and the operator's own Prometheus
//! credentials (shown in status and events). Each test acts as the [`Tenant`] against the real
//! operator, kube-apiserver and Prometheus, and fails when its protection is removed.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{BackpressurePolicy, WorkerBackpressureStatus};
use backpressure_api::wire::metrics as m;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::fleet::FakeFleet;
use crate::common::scene::{Scene, condition, spec, status_of};
use crate::common::serial;
use crate::common::tenant::Tenant;
use crate::common::world::{W, World};

/// A listener the test controls, standing for a server the tenant runs: it records every
/// request head it receives and answers queries with one fresh sample per workload it knows,
/// dated now (so a request that carried credentials would have "worked").
#[derive(Clone)]
struct Listener {
    heads: Arc<Mutex<Vec<String>>>,
    connections: Arc<AtomicU64>,
    hang_up: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

impl Listener {
    /// Listens on `ip` (127.0.0.1 is allowed to every test operator, 127.0.0.2 is not) and
    /// answers for `(namespace, workload)` pairs.
    fn start(ip: &str, workloads: &[(&str, &str)]) -> Listener {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let l = Listener {
            heads: Arc::default(),
            connections: Arc::default(),
            hang_up: Arc::default(),
            addr,
        };
        let workloads: Vec<(String, String)> = workloads
            .iter()
            .map(|(n, w)| ((*n).to_owned(), (*w).to_owned()))
            .collect();
        let me = l.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (me, wl) = (me.clone(), workloads.clone());
                std::thread::spawn(move || me.serve(conn, &wl));
            }
        });
        l
    }

    fn serve(&self, mut conn: TcpStream, workloads: &[(String, String)]) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") && buf.len() < 64 * 1024 {
            match conn.read(&mut byte) {
                Ok(1) => buf.push(byte[0]),
                _ => break,
            }
        }
        self.heads
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&buf).into_owned());
        if self.hang_up.load(Ordering::Relaxed) {
            return;
        }
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Each value with the timestamp series that dates it (a value without one is unknown).
        let result: Vec<Value> = workloads
            .iter()
            .flat_map(|(ns, wl)| {
                [
                    json!({"metric": {m::LABEL_NAMESPACE: ns, m::LABEL_WORKLOAD: wl}, "value": [t, "1"]}),
                    json!({"metric": {m::LABEL_NAMESPACE: ns, m::LABEL_WORKLOAD: wl, "bp_sample": "timestamp"}, "value": [t, t.to_string()]}),
                ]
            })
            .collect();
        let body = json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string();
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }

    /// `http://<ip>:<port>`.
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request head received so far, concatenated.
    fn seen(&self) -> String {
        self.heads.lock().unwrap().join("\n")
    }

    fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

/// The MetricsAvailable condition's message of `name`, once it is False and names `field`.
async fn refused(scene: &Scene, name: &str, field: &str) -> String {
    refused_while(scene, name, field, || ()).await
}

/// [`refused`], calling `check` (which panics on what must not happen) while it waits.
async fn refused_while(scene: &Scene, name: &str, field: &str, check: impl Fn()) -> String {
    crate::common::scene::wait_for(
        Duration::from_secs(30),
        &format!("{name}: MetricsAvailable False naming {field}"),
        || async { format!("{:#?}", scene.status(name).await) },
        || async {
            check();
            let s = scene.status(name).await;
            condition(&s, cond::METRICS_AVAILABLE)
                .filter(|c| c.status == "False" && c.message.contains(field))
                .map(|c| c.message.clone())
        },
    )
    .await
}

/// Event notes about object `name` in the namespace.
async fn notes_about(scene: &Scene, name: &str) -> Vec<String> {
    scene
        .events()
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.note)
        .collect()
}

/// A Secret the namespace's admin created for something else (a database), with the keys the
/// operator reads: a tenant who may not read Secrets names it in `secretRef` and points
/// `address` at a listener of its own. The operator sends no credentials there (the Secret does
/// not list that address, and the platform allowed the address but not with credentials), says
/// so in the condition naming `spec.metrics.prometheus.secretRef`, and fetches nothing. Once the
/// Secret's owner consents (the annotation lists the address), the same listener does receive
/// the token: the listener would have seen it.
///
/// Protection: `observe::access::read_secret` (the consent check).
#[tokio::test]
async fn secret_ref_sends_no_credentials_to_an_address_the_secret_does_not_name() {
    let _serial = serial().await;
    let mut w = World::builder("exfil").start().await;
    let ns = w.scene.ns.clone();
    let tenant = Tenant::of(&w.scene).await;
    let listener = Listener::start("127.0.0.2", &[(&ns, W)]);

    // The platform lets this namespace query its own Prometheus (the listener), without
    // trusting it with credentials.
    let policy: BackpressurePolicy = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-own-prometheus")},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "metricsAccess": {"prometheusAddresses": [{"address": listener.url()}]},
        },
    }))
    .unwrap();
    Api::<BackpressurePolicy>::all(w.scene.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let token = "s3cr3t-db-token-0f9a";
    let password = "s3cr3t-db-password-77c1";
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-credentials"},
        "stringData": {"token": token, "username": "db", "password": password},
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(w.scene.client.clone(), &ns);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    w.start_operator().await;

    tenant
        .apply(
            W,
            spec(
                W,
                W,
                &listener.url(),
                json!({"metrics": {"prometheus": {"secretRef": {"name": "db-credentials"}}}}),
            ),
        )
        .await
        .unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("db:{password}"));
    let no_leak = || {
        let seen = listener.seen();
        assert!(
            !seen.contains(token) && !seen.contains(&basic) && !seen.contains(password),
            "the tenant's listener received the Secret's credentials:\n{seen}"
        );
    };
    let message = refused_while(&w.scene, W, "spec.metrics.prometheus.secretRef", no_leak).await;
    // Several reconciles (one a second) later, still nothing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    no_leak();
    let seen = listener.seen();
    assert_eq!(
        listener.connections(),
        0,
        "a refused Secret fetches nothing:\n{seen}"
    );
    assert!(
        !message.contains(token) && !message.contains(password),
        "{message}"
    );

    // The Secret's owner consents: now, and only now, the credentials go there.
    secrets
        .patch(
            "db-credentials",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {
                "backpressure.dev/prometheus-addresses": listener.url(),
            }}})),
        )
        .await
        .unwrap();
    w.wait_for(
        Duration::from_secs(30),
        "the consenting Secret's token at the listener",
        || async {
            listener
                .seen()
                .contains(&format!("Bearer {token}"))
                .then_some(())
        },
    )
    .await;
}

/// Namespace B's fleet is in the same Prometheus as A's (as in any shared Prometheus). The
/// tenant of A overrides its queries with ones that select B's series and relabel them as A's.
/// A's `status.fleet` shows A's own values, never B's: every selector of the tenant's query is
/// restricted to `namespace="<A>"`.
///
/// Protection: `backpressure_core::tenancy::scoped_queries` (called in the observe step).
#[tokio::test]
async fn a_tenant_query_cannot_read_another_namespace() {
    let _serial = serial().await;
    let mut w = World::builder("xns-a").start().await;
    let a = w.scene.ns.clone();
    let b = Scene::new("xns-b").await;
    let fleet_b = FakeFleet::start(&b.ns, W, 1);
    fleet_b.set(|k| {
        k.backoff = 0.77;
        k.queue_age = 7777.0;
        k.queue_depth = 777_777.0;
    });
    w.fleet.set(|k| {
        k.backoff = 0.0;
        k.queue_age = 4.0;
        k.queue_depth = 42.0;
    });
    w.prom
        .set_targets(&[w.fleet.target(), fleet_b.target()])
        .unwrap();
    let relabel = |agg: &str, metric: &str| {
        format!(
            r#"label_replace({agg} by (namespace, workload) ({metric}{{namespace="{}"}}), "namespace", "{a}", "", "")"#,
            b.ns
        )
    };
    let queue_depth = relabel("sum", m::QUEUE_DEPTH);
    // The attack works on this Prometheus: B's depth under A's name (a blocking wait; the
    // operator is not started yet).
    let answer = w
        .prom
        .wait_for_series(&queue_depth, Duration::from_secs(30))
        .unwrap();
    assert_eq!(answer["data"]["result"][0]["metric"]["namespace"], a);
    assert_eq!(answer["data"]["result"][0]["value"][1], "777777");

    let tenant = Tenant::of(&w.scene).await;
    w.start_operator().await;
    tenant
        .apply(
            W,
            spec(
                W,
                W,
                &w.prom.url(),
                json!({"metrics": {"queries": {
                    "queueDepth": queue_depth,
                    "queueAge": relabel("max", m::QUEUE_AGE),
                    "backoff": relabel("avg", m::BACKOFF),
                }}}),
            ),
        )
        .await
        .unwrap();

    let shows_b = |s: &WorkerBackpressureStatus| {
        s.fleet.as_ref().is_some_and(|f| {
            // (status rounds to a few significant digits)
            f.queue_depth.is_some_and(|d| d > 1000.0)
                || f.queue_age.is_some_and(|a| a > 1000.0)
                || f.backoff.is_some_and(|b| b > 0.5)
        })
    };
    // A's own values arrive (the scoped query runs)...
    let status = w
        .wait_status(Duration::from_secs(45), "A's own queue depth", |s| {
            assert!(
                !shows_b(s),
                "A's status.fleet shows B's values: {:?}",
                s.fleet
            );
            s.fleet.as_ref().and_then(|f| f.queue_depth) == Some(42.0)
        })
        .await;
    assert_eq!(status.fleet.as_ref().and_then(|f| f.queue_age), Some(4.0));
    // ...and B's never do.
    for _ in 0..12 {
        let s = status_of(&w.scene.client, &a, W).await;
        assert!(
            !shows_b(&s),
            "A's status.fleet shows B's values: {:?}",
            s.fleet
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The tenant names, as its Prometheus, an address the platform did not allow: one where a
/// server listens and one where nothing does. Neither is fetched (the listener receives no
/// connection), both objects report the same condition naming
/// `spec.metrics.prometheus.address`, and the same events: nothing tells whether the address
/// answered.
///
/// Protection: `observe::access::target` (the allowlist check before any fetch).
#[tokio::test]
async fn a_prometheus_address_outside_the_allowlist_is_never_fetched() {
    let _serial = serial().await;
    let mut w = World::builder("ssrf").start().await;
    let (listening, closed) = ("ssrf-listening", "ssrf-closed");
    w.scene.deployment(listening, 1).await;
    w.scene.deployment(closed, 1).await;
    let tenant = Tenant::of(&w.scene).await;
    // Test operators allow 127.0.0.1 with any port; 127.0.0.2 is outside.
    let listener = Listener::start("127.0.0.2", &[(&w.scene.ns, listening)]);
    let closed_port = {
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap().port()
    };
    w.start_operator().await;
    let field = "spec.metrics.prometheus.address";
    tenant
        .apply(
            listening,
            spec(listening, listening, &listener.url(), json!({})),
        )
        .await
        .unwrap();
    tenant
        .apply(
            closed,
            spec(
                closed,
                closed,
                &format!("http://127.0.0.2:{closed_port}"),
                json!({}),
            ),
        )
        .await
        .unwrap();
    let not_fetched = || {
        assert_eq!(
            listener.connections(),
            0,
            "the operator fetched a refused address:\n{}",
            listener.seen()
        );
    };
    let open_message = refused_while(&w.scene, listening, field, not_fetched).await;
    let closed_message = refused(&w.scene, closed, field).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        listener.connections(),
        0,
        "the operator fetched a refused address:\n{}",
        listener.seen()
    );

    // Same words for a listening and a closed address.
    let port = listener.addr.port().to_string();
    let same =
        |text: &str, port: &str, name: &str| text.replace(port, "PORT").replace(name, "NAME");
    assert_eq!(
        same(&open_message, &port, listening),
        same(&closed_message, &closed_port.to_string(), closed),
        "the condition tells a listening address from a closed one"
    );
    let open_notes: BTreeSet<String> = notes_about(&w.scene, listening)
        .await
        .iter()
        .map(|n| same(n, &port, listening))
        .collect();
    let closed_notes: BTreeSet<String> = notes_about(&w.scene, closed)
        .await
        .iter()
        .map(|n| same(n, &closed_port.to_string(), closed))
        .collect();
    assert!(!open_notes.is_empty());
    assert_eq!(
        open_notes, closed_notes,
        "the events tell a listening address from a closed one"
    );
}

/// The operator started with `--prometheus-url http://user:secretpass@...`: the credentials
/// are used (the Prometheus receives them) but appear in no status, no Event and no log line,
/// also when the queries fail and the messages quote the address.
///
/// Protection: `PrometheusAccess::new` splits the credentials off the URL, and every URL is
/// redacted before it is shown (`tenancy::address::redact`, `redact_text`).
#[tokio::test]
async fn credentials_in_the_prometheus_url_are_used_but_never_shown() {
    let _serial = serial().await;
    let mut w = World::builder("credleak").start().await;
    let ns = w.scene.ns.clone();
    let prometheus = Listener::start("127.0.0.1", &[(&ns, W)]);
    let url = format!("http://user:secretpass@{}", prometheus.addr);
    w.start_operator_with(&url, &[]).await;
    // An object on the operator's Prometheus (no address of its own).
    let mut s = spec(W, W, "http://unused", json!({}));
    s["metrics"]["prometheus"]
        .as_object_mut()
        .unwrap()
        .remove("address");
    Tenant::of(&w.scene).await.apply(W, s).await.unwrap();

    let basic = base64::engine::general_purpose::STANDARD.encode("user:secretpass");
    w.wait_status(
        Duration::from_secs(30),
        "metrics from the operator's Prometheus",
        |s| crate::common::scene::has_condition(s, cond::METRICS_AVAILABLE, "True"),
    )
    .await;
    assert!(
        prometheus.seen().contains(&format!("Basic {basic}")),
        "the credentials of --prometheus-url were not sent:\n{}",
        prometheus.seen()
    );

    // Queries fail now (the server hangs up): the messages quote the address.
    prometheus.hang_up.store(true, Ordering::Relaxed);
    let message = refused(&w.scene, W, &prometheus.addr.to_string()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let object = w.wbps().get(W).await.unwrap();
    let status = serde_json::to_string(&object.status).unwrap();
    let notes = notes_about(&w.scene, W).await.join("\n");
    let log = w.operator().log();
    for (what, text) in [
        ("status", &status),
        ("events", &notes),
        ("operator log", &log),
    ] {
        assert!(
            !text.contains("secretpass"),
            "the password of --prometheus-url is in the {what}:\n{}",
            text.lines()
                .filter(|l| l.contains("secretpass"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(!message.contains("user:"), "{message}");
    assert!(notes.contains(&prometheus.addr.to_string()), "{notes}");
}
