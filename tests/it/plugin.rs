//! `kubectl-wbp`, the built binary, against the real API server: one test per subcommand
//! (`status`, `explain`, `hold --for`, `release`, `dry-run on|off` by name and by `-l`,
//! `-o json`), on objects whose status is written through the status subresource, and with the
//! real operator running: a hold really stops scale-out until it is released, and DryRun by
//! annotation really stops the operator's writes.
//!
//! Every test holds [`serial`]: an operator watches all namespaces and would otherwise rewrite
//! the hand-made statuses of another test.

use std::process::Command;
use std::time::Duration;

use backpressure_api::WorkerBackpressure;
use backpressure_envtest::TestEnv;
use backpressure_operator::annotations;
use backpressure_operator::plugin;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::fleet::backlog;
use crate::common::scene::{Scene, spec};
use crate::common::serial;
use crate::common::world::World;

/// What one run of the plugin printed.
#[derive(Debug)]
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the built `kubectl-wbp` with the test control plane's admin kubeconfig.
fn wbp(args: &[&str]) -> Run {
    wbp_with(args, &[])
}

fn wbp_with(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-wbp"))
        .env("KUBECONFIG", TestEnv::shared().kubeconfig_path())
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(args: &[&str]) -> String {
    let r = wbp(args);
    assert!(r.ok, "kubectl-wbp {args:?} failed: {r:?}");
    r.stdout
}

async fn setup(prefix: &str) -> (kube::Client, String) {
    let Scene { client, ns, .. } = Scene::new(prefix).await;
    (client, ns)
}

/// Creates a WorkerBackpressure `name` (for a Deployment of the same name) with `labels`.
async fn create(client: &kube::Client, ns: &str, name: &str, labels: Value) {
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), ns);
    let obj: WorkerBackpressure = serde_json::from_value(json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "metadata": {"name": name, "labels": labels},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// Writes `status` through the status subresource, as the operator does.
async fn write_status(client: &kube::Client, ns: &str, name: &str, status: Value) {
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), ns);
    let patch = json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply("test-operator").force(),
        &Patch::Apply(&patch),
    )
    .await
    .unwrap();
}

fn ago(secs: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() - secs)
        .unwrap()
        .to_string()
}

/// A status as the operator writes it: regime, replicas, fleet, a decision, conditions.
fn status(regime: &str, current: i32, recommended: i32, backoff: f64, since: i64) -> Value {
    json!({
        "observedGeneration": 1,
        "regime": regime,
        "replicas": {"current": current, "desired": current, "recommended": recommended},
        "fleet": {"backoff": backoff, "failureRate": 0.25, "queueAge": 412.0, "queueDepth": 5400.0,
                  "arrivalRate": 90.0, "completionRate": 30.0},
        "lastDecision": {
            "time": ago(since),
            "action": "HoldScaleOut",
            "from": current,
            "to": current,
            "reason": format!("fleet backoff {backoff:.2} > hold threshold 0.20 for 45s"),
        },
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled",
             "message": "regime ok", "lastTransitionTime": ago(3 * since),
             "observedGeneration": 1},
            {"type": "ScaleOutHeld", "status": "True", "reason": "DependencyFailing",
             "message": "holding", "lastTransitionTime": ago(since), "observedGeneration": 1},
        ],
    })
}

fn annotation(w: &WorkerBackpressure, key: &str) -> Option<String> {
    w.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .cloned()
}

// ---------------------------------------------------------------------------------------------
// Subcommands on hand-made objects

#[tokio::test]
async fn status_prints_the_fleet_table_and_json() {
    let _serial = serial().await;
    let (client, ns) = setup("wbp-status").await;
    let (_, other) = setup("wbp-status-other").await;
    let long = "export-worker-with-a-rather-long-name-for-a-narrow-terminal";
    create(&client, &ns, "mail", json!({})).await;
    create(&client, &ns, long, json!({})).await;
    create(&client, &other, "billing", json!({})).await;
    write_status(
        &client,
        &ns,
        long,
        status("DependencyFailing", 8, 14, 0.31, 300),
    )
    .await;
    write_status(
        &client,
        &other,
        "billing",
        status("Healthy", 3, 3, 0.0, 7200),
    )
    .await;
    // "mail" has no status yet.

    let t = ok(&["status", "-n", &ns]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3, "{t}");
    for h in [
        "NAMESPACE",
        "NAME",
        "REGIME",
        "REPLICAS",
        "BACKOFF",
        "QUEUE AGE",
        "SINCE",
    ] {
        assert!(lines[0].contains(h), "header lacks {h}: {t}");
    }
    // Piped output is not truncated; sorted by name: the long one first, then mail.
    assert!(t.contains(long), "{t}");
    let held = lines[1];
    assert!(held.contains("DependencyFailing"), "{t}");
    assert!(held.contains("8/8/14"), "current/desired/recommended: {t}");
    assert!(held.contains("0.31"), "{t}");
    assert!(held.contains("6m"), "queue age 412 s: {t}");
    assert!(held.contains("5m"), "since 300 s: {t}");
    assert!(lines[2].contains("mail") && lines[2].contains(" -"), "{t}");
    assert!(!t.contains("billing"), "another namespace leaked in: {t}");

    // All namespaces.
    let all = ok(&["status", "-A"]);
    assert!(all.contains("billing") && all.contains("Healthy") && all.contains("3/3/3"));
    assert!(all.contains("2h"), "since 7200 s: {all}");

    // It fits the terminal: the name column is truncated.
    let narrow = wbp_with(&["status", "-n", &ns], &[("COLUMNS", "100")]);
    assert!(narrow.ok, "{narrow:?}");
    assert!(
        narrow.stdout.lines().all(|l| l.chars().count() <= 100),
        "wider than 100 columns:\n{}",
        narrow.stdout
    );
    assert!(narrow.stdout.contains('…'), "{}", narrow.stdout);
    // Without COLUMNS, on a terminal: the terminal's width (util-linux `script` gives the
    // plugin a pseudo-terminal of 80 columns).
    let bin = env!("CARGO_BIN_EXE_kubectl-wbp");
    let tty = Command::new("script")
        .args([
            "-qec",
            &format!("stty cols 80 rows 40; {bin} status -n {ns}"),
            "/dev/null",
        ])
        .env("KUBECONFIG", TestEnv::shared().kubeconfig_path())
        .env_remove("COLUMNS")
        .output()
        .expect("util-linux `script` (Debian bsdutils) runs the plugin on a pseudo-terminal");
    let tty_out = String::from_utf8_lossy(&tty.stdout).replace('\r', "");
    assert!(tty.status.success(), "{tty_out}");
    assert!(
        tty_out.contains("REGIME") && tty_out.contains("8/8/14") && tty_out.contains('…'),
        "{tty_out}"
    );
    assert!(
        tty_out.lines().all(|l| l.chars().count() <= 80),
        "wider than the 80-column terminal:\n{tty_out}"
    );
    let wide = wbp_with(&["status", "-n", &ns], &[("COLUMNS", "200")]);
    assert!(
        wide.stdout.contains(long),
        "truncated at 200 columns: {wide:?}"
    );

    // JSON.
    let j: Value = serde_json::from_str(&ok(&["status", "-n", &ns, "-o", "json"])).unwrap();
    let rows = j.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], long);
    assert_eq!(rows[0]["regime"], "DependencyFailing");
    assert_eq!(rows[0]["current"], 8);
    assert_eq!(rows[0]["recommended"], 14);
    assert_eq!(rows[0]["backoff"], 0.31);
    assert_eq!(rows[0]["queueAge"], 412.0);
    let since = rows[0]["sinceSeconds"].as_i64().unwrap();
    assert!((300..330).contains(&since), "{since}");
    assert_eq!(rows[1]["regime"], "-");
    assert_eq!(rows[1]["current"], Value::Null);
}

#[tokio::test]
async fn explain_gives_the_decision_conditions_and_events() {
    let _serial = serial().await;
    let (client, ns) = setup("wbp-explain").await;
    create(&client, &ns, "export", json!({})).await;
    write_status(
        &client,
        &ns,
        "export",
        status("DependencyFailing", 8, 14, 0.31, 60),
    )
    .await;
    let uid = Api::<WorkerBackpressure>::namespaced(client.clone(), &ns)
        .get("export")
        .await
        .unwrap()
        .metadata
        .uid;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    for (name, reason, note, regarding) in [
        (
            "export.1",
            "ScaleOutHeld",
            "fleet backoff 0.31 > 0.20 for 45s: holding at 8 replicas",
            "export",
        ),
        ("other.1", "ScaledOut", "not about export", "other"),
    ] {
        let e: Event = serde_json::from_value(json!({
            "metadata": {"name": name},
            "eventTime": MicroTime(Timestamp::now()),
            "type": "Warning",
            "reason": reason,
            "action": "Decide",
            "note": note,
            "reportingController": "backpressure.dev/operator",
            "reportingInstance": "test",
            "regarding": {
                "apiVersion": "backpressure.dev/v1alpha1",
                "kind": "WorkerBackpressure",
                "name": regarding,
                "namespace": ns,
                "uid": uid,
            },
        }))
        .unwrap();
        events.create(&PostParams::default(), &e).await.unwrap();
    }

    let t = ok(&["explain", "export", "-n", &ns]);
    assert!(
        t.starts_with(&format!("{ns}/export: DependencyFailing")),
        "{t}"
    );
    assert!(
        t.contains("current 8 desired 8 recommended 14"),
        "replicas: {t}"
    );
    assert!(
        t.contains("backoff 0.31") && t.contains("failures 25.0%"),
        "fleet: {t}"
    );
    assert!(
        t.contains("HoldScaleOut 8 -> 8") && t.contains("s ago: HoldScaleOut"),
        "decision: {t}"
    );
    assert!(
        t.contains("fleet backoff 0.31 > hold threshold 0.20 for 45s"),
        "reason: {t}"
    );
    assert!(
        t.contains("ScaleOutHeld") && t.contains("DependencyFailing"),
        "conditions: {t}"
    );
    assert!(
        t.contains("holding at 8 replicas"),
        "the event about it: {t}"
    );
    assert!(
        !t.contains("not about export"),
        "an event about another object: {t}"
    );

    let j: Value =
        serde_json::from_str(&ok(&["explain", "export", "-n", &ns, "-o", "json"])).unwrap();
    assert_eq!(j["status"]["lastDecision"]["action"], "HoldScaleOut");
    assert_eq!(j["status"]["replicas"]["recommended"], 14);
    assert_eq!(j["events"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j["events"][0]["reason"], "ScaleOutHeld");

    // A missing object is an error with its name, not an empty page.
    let r = wbp(&["explain", "nothing", "-n", &ns]);
    assert!(!r.ok && r.stderr.contains("nothing"), "{r:?}");
}

#[tokio::test]
async fn hold_and_release_set_and_remove_the_annotation() {
    let _serial = serial().await;
    let (client, ns) = setup("wbp-hold").await;
    create(&client, &ns, "export", json!({"team": "shop"})).await;
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &ns);

    let before = Timestamp::now().as_second();
    let out = ok(&["hold", "export", "--for", "30m", "-n", &ns]);
    let after = Timestamp::now().as_second();
    assert!(out.contains("held until"), "{out}");
    let w = api.get("export").await.unwrap();
    let until: Timestamp = annotation(&w, annotations::HOLD_UNTIL)
        .expect("hold-until annotation")
        .parse()
        .unwrap();
    assert!(
        (before + 1800..=after + 1800).contains(&until.as_second()),
        "hold until {until}, expected 30 minutes from now"
    );
    assert!(out.contains(&until.to_string()), "{out}");
    // The operator's reader sees a hold in force.
    let manual = annotations::read(w.metadata.annotations.as_ref(), Timestamp::now());
    assert_eq!(manual.hold_until, Some(until));
    assert!(manual.invalid.is_empty(), "{manual:?}");
    // Written under the plugin's own field manager.
    let mf = w.metadata.managed_fields.clone().unwrap_or_default();
    let owner = mf
        .iter()
        .find(|e| {
            e.fields_v1.as_ref().is_some_and(|f| {
                f.0["f:metadata"]["f:annotations"]
                    .get(format!("f:{}", annotations::HOLD_UNTIL))
                    .is_some()
            })
        })
        .and_then(|e| e.manager.clone());
    assert_eq!(owner.as_deref(), Some(plugin::FIELD_MANAGER), "{mf:?}");
    // The status table and explain show it.
    assert!(ok(&["status", "-n", &ns]).contains("(hold)"));
    assert!(ok(&["explain", "export", "-n", &ns]).contains("scale-out held until"));

    // A GitOps re-apply of the object (server-side apply, no force) keeps the hold.
    let git = json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "metadata": {"name": "export", "labels": {"team": "shop"}},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "export"}},
    });
    api.patch(
        "export",
        &PatchParams::apply("kustomize-controller"),
        &Patch::Apply(&git),
    )
    .await
    .unwrap();
    assert!(annotation(&api.get("export").await.unwrap(), annotations::HOLD_UNTIL).is_some());

    // Another duration replaces it.
    ok(&["hold", "export", "--for", "1h30m", "-n", &ns]);
    let until2: Timestamp = annotation(&api.get("export").await.unwrap(), annotations::HOLD_UNTIL)
        .unwrap()
        .parse()
        .unwrap();
    assert!(until2.as_second() - until.as_second() >= 3600, "{until2}");

    // Release removes it (and only it).
    let out = ok(&["release", "export", "-n", &ns]);
    assert!(out.contains("released"), "{out}");
    let w = api.get("export").await.unwrap();
    assert_eq!(annotation(&w, annotations::HOLD_UNTIL), None);
    assert_eq!(w.metadata.labels.unwrap()["team"], "shop");
    assert!(!ok(&["status", "-n", &ns]).contains("(hold)"));

    // Errors: a bad duration, a missing object.
    let r = wbp(&["hold", "export", "--for", "soon", "-n", &ns]);
    assert!(!r.ok && r.stderr.contains("soon"), "{r:?}");
    assert_eq!(
        annotation(&api.get("export").await.unwrap(), annotations::HOLD_UNTIL),
        None
    );
    let r = wbp(&["hold", "nothing", "--for", "5m", "-n", &ns]);
    assert!(!r.ok && r.stderr.contains("nothing"), "{r:?}");
}

#[tokio::test]
async fn dry_run_on_and_off_by_name_and_by_selector() {
    let _serial = serial().await;
    let (client, ns) = setup("wbp-dryrun").await;
    create(&client, &ns, "a1", json!({"team": "a"})).await;
    create(&client, &ns, "a2", json!({"team": "a"})).await;
    create(&client, &ns, "b1", json!({"team": "b"})).await;
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &ns);
    let dry = |w: &WorkerBackpressure| annotation(w, annotations::DRY_RUN);
    let states = || async {
        let mut v = Vec::new();
        for n in ["a1", "a2", "b1"] {
            v.push(dry(&api.get(n).await.unwrap()));
        }
        v
    };

    let out = ok(&["dry-run", "on", "-l", "team=a", "-n", &ns]);
    assert!(
        out.contains("workerbackpressure/a1 dry-run on")
            && out.contains("workerbackpressure/a2 dry-run on"),
        "{out}"
    );
    let t = Some("true".to_owned());
    assert_eq!(states().await, vec![t.clone(), t.clone(), None]);
    assert!(
        annotations::read(
            api.get("a1").await.unwrap().metadata.annotations.as_ref(),
            Timestamp::now()
        )
        .dry_run
    );
    assert!(ok(&["status", "-n", &ns]).contains("(dry-run)"));

    ok(&["dry-run", "on", "b1", "-n", &ns]);
    assert_eq!(states().await, vec![t.clone(), t.clone(), t.clone()]);

    ok(&["dry-run", "off", "a1", "-n", &ns]);
    assert_eq!(states().await, vec![None, t.clone(), t.clone()]);

    ok(&["dry-run", "off", "-l", "team in (a,b)", "-n", &ns]);
    assert_eq!(states().await, vec![None, None, None]);

    let out = ok(&["dry-run", "on", "-l", "team=nobody", "-n", &ns]);
    assert!(out.contains("no WorkerBackpressure matched"), "{out}");

    // Neither or both of NAME and -l, or a bad state: errors, nothing changes.
    for args in [
        vec!["dry-run", "on"],
        vec!["dry-run", "on", "a1", "-l", "team=a"],
        vec!["dry-run", "maybe", "a1"],
    ] {
        let mut full = args.clone();
        full.extend(["-n", ns.as_str()]);
        let r = wbp(&full);
        assert!(!r.ok, "{full:?} succeeded: {r:?}");
        assert!(!r.stderr.is_empty());
    }
    assert_eq!(states().await, vec![None, None, None]);
}

// ---------------------------------------------------------------------------------------------
// With the operator running

/// A world (Deployment `w` with 2 replicas, 2 fake pods) whose WorkerBackpressure `w` is what
/// Git holds: the test spec without a `rampUp` section, labelled `team=shop`, applied by field
/// manager `git`.
async fn live(prefix: &str) -> World {
    let w = World::builder(prefix).replicas(2).pods(2).start().await;
    let mut spec = spec("w", "w", &w.prom.url(), json!({}));
    spec["scaling"].as_object_mut().unwrap().remove("rampUp");
    w.git_apply("w", "git", spec).await.unwrap();
    w
}

#[tokio::test]
async fn a_hold_stops_scale_out_until_it_is_released() {
    let _serial = serial().await;
    let mut w = live("wbp-live-hold").await;
    w.fleet.set(backlog);
    ok(&["hold", "w", "--for", "30m", "-n", &w.scene.ns]);
    w.start_operator().await;

    // The operator sees the backlog (a backlog-only autoscaler would add pods) ...
    let s = w
        .wait_for(
            Duration::from_secs(60),
            "a decision on the backlog",
            || async {
                let s = w.status().await;
                s.replicas
                    .as_ref()
                    .is_some_and(|r| r.recommended > r.current)
                    .then_some(s)
            },
        )
        .await;
    // ... and holds: several reconciles (1 s apart) later nothing was scaled.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(w.replicas().await, 2, "scaled out during a manual hold");
    assert_eq!(
        w.scale_writes(),
        Vec::<String>::new(),
        "the operator wrote /scale during a hold"
    );
    let r = w.status().await.replicas.unwrap();
    assert_eq!(r.desired, 2, "desired is the held replica count: {s:?}");

    // The plugin shows the fleet as the operator sees it: held at 2 of 2, with the backlog's
    // recommendation above. The recommendation follows the growing queue age, so it may have
    // moved since `r` was read: the row is checked against the hold, not against `r`.
    let t = ok(&["status", "-n", &w.scene.ns]);
    let row = t.lines().find(|l| l.contains(" w ")).unwrap_or_default();
    let recommended = row
        .split_once("2/2/")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<i32>().ok());
    assert!(
        row.contains("(hold)") && recommended.is_some_and(|n| n > 2),
        "expected a held row 2/2/<recommended above 2> (status said {}): {t}",
        r.recommended
    );
    let e = ok(&["explain", "w", "-n", &w.scene.ns]);
    assert!(e.contains("scale-out held until"), "{e}");

    // Released: scale-out resumes.
    ok(&["release", "w", "-n", &w.scene.ns]);
    w.wait_for(
        Duration::from_secs(60),
        "scale-out after release",
        || async { (w.replicas().await > 2).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn dry_run_by_annotation_stops_the_operators_writes() {
    let _serial = serial().await;
    let mut w = live("wbp-live-dry").await;
    w.fleet.set(backlog);
    let out = ok(&["dry-run", "on", "-l", "team=shop", "-n", &w.scene.ns]);
    assert!(out.contains("workerbackpressure/w dry-run on"), "{out}");
    w.start_operator().await;

    let d = w
        .wait_for(
            Duration::from_secs(60),
            "a dry-run scale-out decision",
            || async {
                w.status()
                    .await
                    .last_decision
                    .filter(|d| d.dry_run == Some(true) && d.to > d.from)
            },
        )
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.replicas().await, 2, "DryRun wrote to the target: {d:?}");
    assert_eq!(
        w.scale_writes(),
        Vec::<String>::new(),
        "the operator wrote /scale in DryRun"
    );
    let cms: Api<ConfigMap> = Api::namespaced(w.scene.client.clone(), &w.scene.ns);
    assert!(
        cms.get_opt("w-worker-config").await.unwrap().is_none(),
        "the operator wrote the worker ConfigMap in DryRun"
    );
    let e = ok(&["explain", "w", "-n", &w.scene.ns]);
    assert!(
        e.contains("dry run: not applied") && e.contains("dry run: nothing is written"),
        "{e}"
    );

    // Off again: the operator acts.
    ok(&["dry-run", "off", "w", "-n", &w.scene.ns]);
    w.wait_for(
        Duration::from_secs(60),
        "scale-out after dry-run off",
        || async { (w.replicas().await > 2).then_some(()) },
    )
    .await;
    assert!(!w.scale_writes().is_empty());
}
