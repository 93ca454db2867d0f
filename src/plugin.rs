//! Rendering for the `kubectl wbp` plugin: pure functions from objects to text, so every
//! subcommand's output is testable without a cluster.

use std::fmt::Write as _;

use backpressure_api::WorkerBackpressure;
use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::Mode;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use crate::annotations;

/// Field manager of the plugin's writes (the annotations of `hold`, `release` and `dry-run`),
/// so that `managedFields` show who set them and GitOps tools leave them alone.
pub const FIELD_MANAGER: &str = "kubectl-wbp";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table that fits the terminal.
    Table,
    /// JSON.
    Json,
}

/// One row of `kubectl wbp status`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Regime, or `-` before the first reconcile.
    pub regime: String,
    /// Current replicas.
    pub current: Option<i32>,
    /// Desired replicas.
    pub desired: Option<i32>,
    /// Recommended replicas.
    pub recommended: Option<i32>,
    /// Fleet backoff.
    pub backoff: Option<f64>,
    /// Queue age in seconds.
    pub queue_age: Option<f64>,
    /// Seconds since the last condition transition (the regime's age).
    pub since_seconds: Option<i64>,
    /// A manual hold (`kubectl wbp hold`) in force until this time (RFC 3339).
    pub held_until: Option<String>,
    /// DryRun: by `spec.mode`, the `kubectl wbp dry-run` annotation, or (as the operator last
    /// reported in `status.dryRunBy`) a policy.
    pub dry_run: bool,
}

fn row(w: &WorkerBackpressure, now: Timestamp) -> StatusRow {
    let s = w.status.as_ref();
    let r = s.and_then(|s| s.replicas.as_ref());
    let f = s.and_then(|s| s.fleet.as_ref());
    let since = s
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .filter(|c| c.type_ != cond::CONFIG_IN_SYNC && c.type_ != cond::READY)
                .map(|c| c.last_transition_time.0)
                .max()
        })
        .map(|t| now.as_second() - t.as_second());
    let manual = annotations::read(w.metadata.annotations.as_ref(), now);
    StatusRow {
        namespace: w.metadata.namespace.clone().unwrap_or_default(),
        name: w.metadata.name.clone().unwrap_or_default(),
        regime: s
            .and_then(|s| s.regime)
            .map_or("-".into(), |r| r.as_str().to_owned()),
        current: r.map(|r| r.current),
        desired: r.map(|r| r.desired),
        recommended: r.map(|r| r.recommended),
        backoff: f.and_then(|f| f.backoff),
        queue_age: f.and_then(|f| f.queue_age),
        since_seconds: since,
        held_until: manual.hold_until.map(|t| t.to_string()),
        dry_run: manual.dry_run
            || w.spec.mode == Some(Mode::DryRun)
            || s.is_some_and(|s| s.dry_run_by.is_some()),
    }
}

/// `12s`, `5m`, `3h`, `2d`.
pub fn human_age(secs: i64) -> String {
    match secs {
        s if s < 0 => "0s".into(),
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// `kubectl wbp status`.
pub fn status_table(
    items: &[WorkerBackpressure],
    output: Output,
    now: Timestamp,
    width: usize,
) -> Result<String, serde_json::Error> {
    let mut rows: Vec<StatusRow> = items.iter().map(|w| row(w, now)).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    if output == Output::Json {
        return Ok(serde_json::to_string_pretty(&rows)? + "\n");
    }
    let header = [
        "NAMESPACE",
        "NAME",
        "REGIME",
        "REPLICAS",
        "BACKOFF",
        "QUEUE AGE",
        "SINCE",
    ];
    let mut table: Vec<[String; 7]> = vec![header.map(String::from)];
    for r in &rows {
        table.push([
            r.namespace.clone(),
            r.name.clone(),
            regime_cell(r),
            format!(
                "{}/{}/{}",
                opt(r.current),
                opt(r.desired),
                opt(r.recommended)
            ),
            r.backoff.map_or("-".into(), |b| format!("{b:.2}")),
            r.queue_age
                .map_or("-".into(), |a| human_age(a.round() as i64)),
            r.since_seconds.map_or("-".into(), human_age),
        ]);
    }
    Ok(render(&table, width))
}

/// The regime, marked when a manual hold or DryRun is in force.
fn regime_cell(r: &StatusRow) -> String {
    let mut cell = r.regime.clone();
    if r.held_until.is_some() {
        cell.push_str(" (hold)");
    }
    if r.dry_run {
        cell.push_str(" (dry-run)");
    }
    cell
}

/// Lays out columns, truncating the name columns when the table is wider than `width`.
fn render<const N: usize>(table: &[[String; N]], width: usize) -> String {
    let mut widths = [0usize; N];
    for r in table {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let total = |w: &[usize; N]| w.iter().sum::<usize>() + 3 * (N - 1);
    // Shrink the widest of the first two columns until the table fits (at least 8 chars).
    while total(&widths) > width {
        let i = if widths[0] >= widths[1] { 0 } else { 1 };
        if widths[i] <= 8 {
            break;
        }
        widths[i] -= 1;
    }
    let mut out = String::new();
    for r in table {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let cell: String = if c.chars().count() > widths[i] {
                c.chars()
                    .take(widths[i].saturating_sub(1))
                    .chain(['…'])
                    .collect()
            } else {
                c.clone()
            };
            if i + 1 == N {
                line.push_str(&cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `kubectl wbp explain NAME`.
pub fn explain(
    w: &WorkerBackpressure,
    events: &[Event],
    output: Output,
    now: Timestamp,
) -> Result<String, serde_json::Error> {
    let s = w.status.clone().unwrap_or_default();
    let manual = annotations::read(w.metadata.annotations.as_ref(), now);
    let mut evs: Vec<&Event> = events.iter().collect();
    evs.sort_by_key(|e| event_time(e));
    if output == Output::Json {
        let v = serde_json::json!({
            "name": w.metadata.name,
            "namespace": w.metadata.namespace,
            "heldUntil": manual.hold_until.map(|t| t.to_string()),
            "dryRunByAnnotation": manual.dry_run,
            "status": s,
            "events": evs.iter().map(|e| serde_json::json!({
                "time": event_time(e).map(|t| t.to_string()),
                "type": e.type_,
                "reason": e.reason,
                "note": e.note,
            })).collect::<Vec<_>>(),
        });
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let mut out = String::new();
    let name = format!(
        "{}/{}",
        w.metadata.namespace.clone().unwrap_or_default(),
        w.metadata.name.clone().unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "{name}: {}",
        s.regime.map_or("not reconciled yet", |r| r.as_str())
    );
    if let Some(until) = manual.hold_until {
        let name = w.metadata.name.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "  manual     scale-out held until {until} (annotation {}; `kubectl wbp release {name}` lifts it)",
            annotations::HOLD_UNTIL
        );
    }
    if manual.dry_run {
        let _ = writeln!(
            out,
            "  manual     dry run: nothing is written to the target (annotation {})",
            annotations::DRY_RUN
        );
    }
    for (key, why) in &manual.invalid {
        let _ = writeln!(out, "  manual     annotation {key} ignored: {why}");
    }
    if let Some(r) = &s.replicas {
        let _ = writeln!(
            out,
            "  replicas   current {} desired {} recommended {}",
            r.current, r.desired, r.recommended
        );
    }
    if let Some(f) = &s.fleet {
        let _ = writeln!(
            out,
            "  fleet      backoff {} failures {} queue age {} depth {} in {}/s out {}/s",
            f.backoff.map_or("?".into(), |v| format!("{v:.2}")),
            f.failure_rate
                .map_or("?".into(), |v| format!("{:.1}%", v * 100.0)),
            f.queue_age.map_or("?".into(), |v| format!("{v:.0}s")),
            f.queue_depth.map_or("?".into(), |v| format!("{v:.0}")),
            f.arrival_rate.map_or("?".into(), |v| format!("{v:.1}")),
            f.completion_rate.map_or("?".into(), |v| format!("{v:.1}")),
        );
    }
    if let Some(r) = &s.ramp {
        let _ = writeln!(
            out,
            "  ramp       stage {}/{} from {} to {}",
            r.stage, r.of, r.from, r.to
        );
    }
    if let Some(d) = &s.last_decision {
        let ago = human_age(now.as_second() - d.time.0.as_second());
        let dry = if d.dry_run == Some(true) {
            " (dry run: not applied)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  decision   {ago} ago: {} {} -> {}{dry}",
            d.action.as_str(),
            d.from,
            d.to
        );
        let _ = writeln!(out, "             {}", d.reason);
    }
    if let Some(p) = &s.producers {
        // Producer control is independent of the worker hold: its own line, its own reason.
        let ago = p
            .since
            .as_ref()
            .map_or("?".into(), |t| human_age(now.as_second() - t.0.as_second()));
        let rate = p
            .rate
            .map_or(String::new(), |r| format!(" at most {r} messages/s"));
        let pods = match (p.pods_in_sync, p.pods_total) {
            (Some(i), Some(t)) => format!(", {i} of {t} producer pods in sync"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  producers  {}{rate} for {ago} (watermarks {}){pods}",
            p.state.as_str(),
            p.watermarks.as_deref().unwrap_or("?"),
        );
        if let Some(r) = &p.reason {
            let _ = writeln!(out, "             {r}");
        }
    }
    if let Some(p) = s.policies.as_ref().filter(|p| !p.is_empty()) {
        let _ = writeln!(out, "  policies   {}", p.join(", "));
    }
    for (field, why) in s.overrides.iter().flatten() {
        let _ = writeln!(out, "  override   {field}: {why}");
    }
    let _ = writeln!(out, "conditions:");
    for c in s.conditions.iter().flatten() {
        let _ = writeln!(
            out,
            "  {:<18} {:<6} {:<22} {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    let _ = writeln!(out, "events:");
    if evs.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for e in evs.iter().rev().take(20).rev() {
        let ago = event_time(e).map_or("?".into(), |t| human_age(now.as_second() - t.as_second()));
        let _ = writeln!(
            out,
            "  {ago:>5} ago  {:<8} {:<18} {}",
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.note.clone().unwrap_or_default()
        );
    }
    Ok(out)
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
}

/// Events about the WorkerBackpressure `name` in `ns`.
pub async fn events_for(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Vec<Event>, kube::Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!(
        "regarding.kind=WorkerBackpressure,regarding.name={name}"
    ));
    Ok(api.list(&lp).await?.items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use backpressure_api::v1alpha1::{
        Action, DecisionRecord, FleetStatus, Regime, ReplicaStatus, WorkerBackpressureStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn wbp(ns: &str, name: &str, regime: Regime) -> WorkerBackpressure {
        let mut w = backpressure_core::decide::fixtures::wbp(ns, name);
        let t: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        w.status = Some(WorkerBackpressureStatus {
            regime: Some(regime),
            replicas: Some(ReplicaStatus {
                current: 8,
                desired: 8,
                recommended: 14,
            }),
            fleet: Some(FleetStatus {
                backoff: Some(0.31),
                queue_age: Some(412.0),
                ..Default::default()
            }),
            last_decision: Some(DecisionRecord {
                time: Time(t),
                action: Action::HoldScaleOut,
                from: 8,
                to: 8,
                reason: "fleet backoff 0.31 > 0.20 for 45s".into(),
                dry_run: None,
            }),
            conditions: Some(vec![Condition {
                type_: cond::SCALE_OUT_HELD.into(),
                status: "True".into(),
                reason: "DependencyFailing".into(),
                message: "held".into(),
                observed_generation: None,
                last_transition_time: Time(t),
            }]),
            ..Default::default()
        });
        w
    }

    #[test]
    fn status_table_shows_the_fleet() {
        let now: Timestamp = "2026-11-30T10:05:00Z".parse().unwrap();
        let items = vec![
            wbp("b", "w2", Regime::Healthy),
            wbp("a", "export-worker", Regime::DependencyFailing),
        ];
        let t = status_table(&items, Output::Table, now, 120).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE"), "{t}");
        assert!(
            lines[1].starts_with("a") && lines[1].contains("DependencyFailing"),
            "{t}"
        );
        assert!(
            lines[1].contains("8/8/14")
                && lines[1].contains("0.31")
                && lines[1].contains("6m")
                && lines[1].contains("5m"),
            "{t}"
        );
        // A narrow terminal truncates the name columns (never the numbers).
        let wide_len = t.lines().map(|l| l.chars().count()).max().unwrap();
        let narrow = status_table(&items, Output::Table, now, 60).unwrap();
        let narrow_len = narrow.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(narrow_len < wide_len, "{narrow}");
        assert!(
            narrow.contains("export-…") && narrow.contains("8/8/14"),
            "{narrow}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&status_table(&items, Output::Json, now, 80).unwrap()).unwrap();
        assert_eq!(json[0]["regime"], "DependencyFailing");
        assert_eq!(json[0]["recommended"], 14);
    }

    #[test]
    fn explain_gives_the_reason_with_numbers() {
        let now: Timestamp = "2026-11-30T10:01:00Z".parse().unwrap();
        let t = explain(
            &wbp("a", "export-worker", Regime::DependencyFailing),
            &[],
            Output::Table,
            now,
        )
        .unwrap();
        assert!(t.contains("HoldScaleOut 8 -> 8"), "{t}");
        assert!(t.contains("fleet backoff 0.31 > 0.20 for 45s"), "{t}");
        assert!(t.contains("ScaleOutHeld"), "{t}");
        let j: serde_json::Value = serde_json::from_str(
            &explain(&wbp("a", "x", Regime::Healthy), &[], Output::Json, now).unwrap(),
        )
        .unwrap();
        assert_eq!(j["status"]["lastDecision"]["action"], "HoldScaleOut");
    }

    #[test]
    fn explain_shows_producer_control_beside_the_worker_hold() {
        use backpressure_api::v1alpha1::{ProducerState, ProducerStatus};
        let now: Timestamp = "2026-11-30T10:01:00Z".parse().unwrap();
        let mut w = wbp("a", "export-worker", Regime::DependencyFailing);
        if let Some(s) = w.status.as_mut() {
            s.producers = Some(ProducerStatus {
                state: ProducerState::Throttled,
                since: Some(Time("2026-11-30T10:00:00Z".parse().unwrap())),
                rate: Some(36.0),
                watermarks: Some("queueDepth 800/200".into()),
                reason: Some("queue depth 812 > 800: producers throttled".into()),
                pods_in_sync: Some(2),
                pods_total: Some(3),
                ..Default::default()
            });
        }
        let t = explain(&w, &[], Output::Table, now).unwrap();
        assert!(t.contains("HoldScaleOut 8 -> 8"), "{t}");
        assert!(
            t.contains("producers  Throttled at most 36 messages/s for 60s (watermarks queueDepth 800/200), 2 of 3 producer pods in sync"),
            "{t}"
        );
        assert!(t.contains("queue depth 812 > 800"), "{t}");
    }

    #[test]
    fn manual_overrides_show_in_the_table_and_in_explain() {
        let now: Timestamp = "2026-11-30T10:05:00Z".parse().unwrap();
        let mut held = wbp("a", "held", Regime::Backlogged);
        held.metadata.annotations = Some(
            [
                (
                    annotations::HOLD_UNTIL.to_owned(),
                    "2026-11-30T10:35:00Z".to_owned(),
                ),
                (annotations::DRY_RUN.to_owned(), "true".to_owned()),
            ]
            .into(),
        );
        let mut expired = wbp("a", "expired", Regime::Healthy);
        expired.metadata.annotations = Some(
            [(
                annotations::HOLD_UNTIL.to_owned(),
                "2026-11-30T10:00:00Z".to_owned(),
            )]
            .into(),
        );
        let items = vec![held.clone(), expired];
        let t = status_table(&items, Output::Table, now, 120).unwrap();
        let held_line = t.lines().find(|l| l.contains("held ")).unwrap();
        assert!(held_line.contains("Backlogged (hold) (dry-run)"), "{t}");
        let expired_line = t.lines().find(|l| l.contains("expired")).unwrap();
        assert!(!expired_line.contains("(hold)"), "{t}");
        let json: serde_json::Value =
            serde_json::from_str(&status_table(&items, Output::Json, now, 80).unwrap()).unwrap();
        assert_eq!(json[1]["heldUntil"], "2026-11-30T10:35:00Z");
        assert_eq!(json[1]["dryRun"], true);
        assert_eq!(json[0]["heldUntil"], serde_json::Value::Null);

        let e = explain(&held, &[], Output::Table, now).unwrap();
        assert!(
            e.contains("scale-out held until 2026-11-30T10:35:00Z")
                && e.contains("kubectl wbp release held")
                && e.contains("dry run"),
            "{e}"
        );
        let j: serde_json::Value =
            serde_json::from_str(&explain(&held, &[], Output::Json, now).unwrap()).unwrap();
        assert_eq!(j["heldUntil"], "2026-11-30T10:35:00Z");
        assert_eq!(j["dryRunByAnnotation"], true);
    }

    #[test]
    fn a_policy_dry_run_shows_in_the_table() {
        let now: Timestamp = "2026-11-30T10:05:00Z".parse().unwrap();
        let mut by_policy = wbp("a", "fleet-dry", Regime::Backlogged);
        if let Some(s) = by_policy.status.as_mut() {
            s.dry_run_by = Some("policy fleet".into());
        }
        let items = vec![by_policy, wbp("a", "acting", Regime::Backlogged)];
        let t = status_table(&items, Output::Table, now, 120).unwrap();
        let line = |name: &str| t.lines().find(|l| l.contains(name)).unwrap().to_owned();
        assert!(line("fleet-dry").contains("Backlogged (dry-run)"), "{t}");
        assert!(!line("acting").contains("(dry-run)"), "{t}");
    }
}
