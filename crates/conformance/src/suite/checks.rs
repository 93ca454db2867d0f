//! The push and metrics checks: what the operator relies on when it talks to a worker.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::wire::{
    self, CONFIG_PATH, ConfigAck, MAX_GENERATION_LEAD_MS, MAX_PAYLOAD_BYTES, WorkerConfig,
    metrics as m,
};
use reqwest::StatusCode;
use serde_json::Value;

use super::exposition::{self, Exposition};
use super::{KubeTokens, Options, Report, SuiteError, Target};

/// What every check shares.
pub(crate) struct Ctx<'a> {
    pub http: &'a reqwest::Client,
    pub target: &'a Target,
    pub options: &'a Options,
}

/// An answer: status and body.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: String,
}

impl Answer {
    fn expect(&self, status: StatusCode) -> Result<(), String> {
        if self.status == status {
            Ok(())
        } else {
            Err(format!(
                "answered {} (expected {status}): {}",
                self.status,
                clip(&self.body)
            ))
        }
    }

    /// The error body's `error` text (the contract: `{"error": "..."}`).
    fn error_text(&self) -> Result<String, String> {
        let v: Value = serde_json::from_str(&self.body)
            .map_err(|e| format!("the error body is not JSON ({e}): {}", clip(&self.body)))?;
        v.get("error")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                format!(
                    "the error body has no \"error\" string: {}",
                    clip(&self.body)
                )
            })
    }
}

fn clip(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Ctx<'_> {
    pub(crate) async fn get(&self, path: &str) -> Result<Answer, String> {
        let resp = self
            .http
            .get(self.target.url(path))
            .send()
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        answer(resp).await
    }

    async fn put(
        &self,
        token: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Result<Answer, String> {
        let mut req = self
            .http
            .put(self.target.url(CONFIG_PATH))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("PUT {CONFIG_PATH}: {e}"))?;
        answer(resp).await
    }

    /// The running configuration (`GET /v1/config`).
    async fn running(&self) -> Result<ConfigAck, String> {
        let a = self.get(CONFIG_PATH).await?;
        a.expect(StatusCode::OK)?;
        serde_json::from_str(&a.body).map_err(|e| {
            format!(
                "GET {CONFIG_PATH} is not {{hash, generation}} ({e}): {}",
                clip(&a.body)
            )
        })
    }

    async fn metrics(&self) -> Result<Exposition, String> {
        let a = self.get("/metrics").await?;
        a.expect(StatusCode::OK)?;
        exposition::parse(&a.body)
    }
}

pub(crate) async fn answer(resp: reqwest::Response) -> Result<Answer, String> {
    let status = resp.status();
    let body = resp
        .text()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok(Answer { status, body })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A valid payload distinct from the worker's defaults (so that taking it is visible), at
/// `generation`, with `max_permits` telling pushes apart.
fn payload(generation: i64, max_permits: u32) -> WorkerConfig {
    WorkerConfig {
        generation,
        max_permits,
        reaction: max_permits.max(1),
        set_point: 0.07,
        ..WorkerConfig::default()
    }
    .with_hash()
}

fn json(cfg: &WorkerConfig) -> String {
    // A WorkerConfig of plain fields always serializes.
    serde_json::to_string(cfg).unwrap_or_default()
}

/// Whether a refused push left the running configuration as it was.
async fn unchanged(ctx: &Ctx<'_>, before: &ConfigAck) -> Result<(), String> {
    let now = ctx.running().await?;
    if &now == before {
        Ok(())
    } else {
        Err(format!(
            "the refused push changed the running configuration: {before:?} -> {now:?}"
        ))
    }
}

/// A refused push: the status, an `{"error"}` body (naming `field` if given), and nothing
/// changed.
async fn refused(
    ctx: &Ctx<'_>,
    before: &ConfigAck,
    answer: Result<Answer, String>,
    status: StatusCode,
    field: Option<&str>,
) -> Result<(), String> {
    let a = answer?;
    a.expect(status)?;
    let text = a.error_text()?;
    if let Some(field) = field
        && !text.contains(field)
    {
        return Err(format!(
            "the error does not name the field {field:?}: {text:?}"
        ));
    }
    unchanged(ctx, before).await
}

pub(crate) async fn run(
    ctx: &Ctx<'_>,
    tokens: &KubeTokens,
    report: &mut Report,
) -> Result<(), SuiteError> {
    let t = ctx.target;
    let audience = wire::push_audience(&t.namespace, &t.workload);
    let token = tokens.mint(&tokens.operator, &audience).await?;
    let other_audience = wire::push_audience(&t.namespace, &format!("{}-other", t.workload));
    let wrong_audience = tokens.mint(&tokens.operator, &other_audience).await?;
    let intruder = tokens.mint(&tokens.other, &audience).await?;

    report.record(
        "healthz",
        async { ctx.get("/healthz").await?.expect(StatusCode::OK) }.await,
    );
    let before = match ctx.running().await {
        Ok(ack) => {
            report.record("get-config", Ok(()));
            ack
        }
        Err(why) => {
            report.record("get-config", Err(why));
            report.skip("push", "GET /v1/config does not answer {hash, generation}");
            return Ok(());
        }
    };
    report.record(
        "metrics-names-types-labels",
        async { check_exposition(&ctx.metrics().await?, &t.workload) }.await,
    );

    // Authentication (three failures: below the contract's burst of ten).
    let body = json(&payload(before.generation.max(now_ms()) + 1, 3));
    report.record(
        "push-without-token-is-401",
        refused(
            ctx,
            &before,
            ctx.put(None, body.clone()).await,
            StatusCode::UNAUTHORIZED,
            None,
        )
        .await,
    );
    report.record(
        "push-for-another-target-is-401",
        refused(
            ctx,
            &before,
            ctx.put(Some(&wrong_audience), body.clone()).await,
            StatusCode::UNAUTHORIZED,
            None,
        )
        .await,
    );
    report.record(
        "push-by-another-identity-is-403",
        refused(
            ctx,
            &before,
            ctx.put(Some(&intruder), body.clone()).await,
            StatusCode::FORBIDDEN,
            None,
        )
        .await,
    );

    // Invalid documents from the right identity.
    let generation = before.generation.max(now_ms()) + 1;
    let doc: Value = serde_json::from_str(&json(&payload(generation, 3))).unwrap_or(Value::Null);
    let edited = |f: &dyn Fn(&mut Value)| {
        let mut d = doc.clone();
        f(&mut d);
        d.to_string()
    };
    let cases: Vec<(&str, String, StatusCode, Option<&str>)> = vec![
        (
            "malformed-json-is-400",
            "{\"version\": ".to_owned(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "unknown-field-is-400",
            edited(&|d| {
                d["surprise"] = Value::from(1);
            }),
            StatusCode::BAD_REQUEST,
            Some("surprise"),
        ),
        (
            "out-of-range-field-is-400-naming-it",
            edited(&|d| {
                d["setPoint"] = Value::from(1.5);
                d["hash"] = Value::from("");
            }),
            StatusCode::BAD_REQUEST,
            Some("setPoint"),
        ),
        (
            "unknown-version-is-400",
            edited(&|d| {
                d["version"] = Value::from("backpressure.dev/worker-config/v0");
                d["hash"] = Value::from("");
            }),
            StatusCode::BAD_REQUEST,
            Some("version"),
        ),
        (
            "hash-mismatch-is-400",
            edited(&|d| {
                d["hash"] = Value::from("000000000000");
            }),
            StatusCode::BAD_REQUEST,
            Some("hash"),
        ),
        (
            "generation-too-far-ahead-is-400",
            edited(&|d| {
                d["generation"] = Value::from(now_ms() + MAX_GENERATION_LEAD_MS + 60_000);
            }),
            StatusCode::BAD_REQUEST,
            Some("generation"),
        ),
        (
            "oversized-is-413",
            oversized(&doc),
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
    ];
    for (name, body, status, field) in cases {
        report.record(
            name,
            refused(
                ctx,
                &before,
                ctx.put(Some(&token), body).await,
                status,
                field,
            )
            .await,
        );
    }

    // A valid push, then the same again, then one without a hash, then a stale one.
    let first = payload(generation, 3);
    let taken = accepted(ctx, &token, &first, &first.hash).await;
    let ok = taken.is_ok();
    report.record("valid-push-is-200-and-runs", taken);
    if !ok {
        report.skip("same-push-again-is-200", "the valid push was not taken");
        report.skip("push-without-hash-is-200", "the valid push was not taken");
        report.skip("stale-generation-is-409", "the valid push was not taken");
        report.skip(
            "config-info-reports-the-hash",
            "the valid push was not taken",
        );
        return Ok(());
    }
    report.record(
        "same-push-again-is-200",
        accepted(ctx, &token, &first, &first.hash).await,
    );
    let mut second = payload(generation + 1, 4);
    let second_hash = second.hash.clone();
    second.hash.clear();
    report.record(
        "push-without-hash-is-200",
        accepted(ctx, &token, &second, &second_hash).await,
    );
    let now = ctx.running().await.unwrap_or(ConfigAck {
        hash: String::new(),
        generation: 0,
    });
    report.record(
        "stale-generation-is-409",
        refused(
            ctx,
            &now,
            ctx.put(Some(&token), json(&payload(generation, 5))).await,
            StatusCode::CONFLICT,
            None,
        )
        .await,
    );
    report.record(
        "config-info-reports-the-hash",
        config_info_shows(ctx, &second_hash).await,
    );
    Ok(())
}

/// A body over [`MAX_PAYLOAD_BYTES`] that is otherwise a valid document.
fn oversized(doc: &Value) -> String {
    let mut d = doc.clone();
    d["padding"] = Value::from("x".repeat(MAX_PAYLOAD_BYTES));
    d.to_string()
}

/// Pushes `cfg` and checks 200 with an acknowledgement of `hash` and its generation, and that
/// `GET` now reports the same.
async fn accepted(
    ctx: &Ctx<'_>,
    token: &str,
    cfg: &WorkerConfig,
    hash: &str,
) -> Result<(), String> {
    let a = ctx.put(Some(token), json(cfg)).await?;
    a.expect(StatusCode::OK)?;
    let ack: ConfigAck = serde_json::from_str(&a.body).map_err(|e| {
        format!(
            "the acknowledgement is not {{hash, generation}} ({e}): {}",
            clip(&a.body)
        )
    })?;
    let want = ConfigAck {
        hash: hash.to_owned(),
        generation: cfg.generation,
    };
    if ack != want {
        return Err(format!("acknowledged {ack:?}, expected {want:?}"));
    }
    let running = ctx.running().await?;
    if running != want {
        return Err(format!(
            "GET {CONFIG_PATH} reports {running:?} after the push, expected {want:?}"
        ));
    }
    Ok(())
}

/// `backpressure_config_info{hash}` names `hash` within the settle time.
async fn config_info_shows(ctx: &Ctx<'_>, hash: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + ctx.options.settle;
    loop {
        let e = ctx.metrics().await?;
        let hashes: Vec<&str> = e
            .family(m::CONFIG_INFO)
            .filter_map(|s| s.labels.get(m::LABEL_HASH).map(String::as_str))
            .collect();
        if hashes == [hash] {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{} reports hashes {hashes:?}, expected exactly [{hash:?}]",
                m::CONFIG_INFO
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The worker families of the contract: name, type, and the labels besides `workload`.
const FAMILIES: [(&str, &str, &[&str]); 7] = [
    (m::BACKOFF, "gauge", &[]),
    (m::FAILURE_FLOOR, "gauge", &[]),
    (m::PERMITS, "gauge", &[]),
    (m::IN_FLIGHT, "gauge", &[]),
    (m::OUTCOMES_TOTAL, "counter", &[m::LABEL_CLASS]),
    (m::PROBES_TOTAL, "counter", &[]),
    (
        m::CONFIG_INFO,
        "gauge",
        &[m::LABEL_HASH, m::LABEL_ALGORITHM],
    ),
];

/// Every family of the contract is there with its type, every sample has exactly the
/// contract's labels with `workload` = the target's, values are in range, and the outcome
/// counter has the three classes.
pub(crate) fn check_exposition(e: &Exposition, workload: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    for (full, kind, extra) in FAMILIES {
        let family = if kind == "counter" {
            full.strip_suffix("_total").unwrap_or(full)
        } else {
            full
        };
        match e.types.get(family) {
            Some(k) if k == kind => {}
            Some(k) => problems.push(format!("{family} is a {k}, expected a {kind}")),
            None => problems.push(format!("{family} has no TYPE line")),
        }
        let samples: Vec<_> = e.family(family).collect();
        if samples.is_empty() {
            problems.push(format!("{family} has no sample"));
        }
        for s in &samples {
            let mut want: Vec<&str> = extra.to_vec();
            want.push(m::LABEL_WORKLOAD);
            want.sort_unstable();
            let have: Vec<&str> = s.labels.keys().map(String::as_str).collect();
            if have != want {
                problems.push(format!("{} has labels {have:?}, expected {want:?}", s.name));
            }
            if s.labels.get(m::LABEL_WORKLOAD).map(String::as_str) != Some(workload) {
                problems.push(format!(
                    "{} has workload {:?}, expected {workload:?}",
                    s.name,
                    s.labels.get(m::LABEL_WORKLOAD)
                ));
            }
            let in_range = match full {
                m::BACKOFF => (0.0..=1.0).contains(&s.value),
                m::FAILURE_FLOOR => s.value.is_nan() || (0.0..=1.0).contains(&s.value),
                m::CONFIG_INFO => s.value == 1.0,
                _ => s.value >= 0.0,
            };
            if !in_range {
                problems.push(format!("{} = {} is out of range", s.name, s.value));
            }
        }
        if full == m::OUTCOMES_TOTAL {
            let mut classes: Vec<&str> = samples
                .iter()
                .filter_map(|s| s.labels.get(m::LABEL_CLASS).map(String::as_str))
                .collect();
            classes.sort_unstable();
            let mut want = m::CLASSES.to_vec();
            want.sort_unstable();
            if classes != want {
                problems.push(format!(
                    "{family} has classes {classes:?}, expected {want:?}"
                ));
            }
        }
        if full == m::CONFIG_INFO && samples.len() > 1 {
            problems.push(format!(
                "{family} has {} series, expected one (the running config)",
                samples.len()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker_exposition(workload: &str) -> String {
        // The Rust worker library's own exposition, so the check agrees with the reference.
        let metrics = backpressure_worker::metrics::Metrics::new(workload);
        metrics.set_config(
            "0123456789ab",
            backpressure_api::v1alpha1::Algorithm::SetPoint,
        );
        metrics.encode()
    }

    #[test]
    fn the_rust_workers_exposition_conforms() {
        let e = exposition::parse(&worker_exposition("w")).unwrap();
        check_exposition(&e, "w").unwrap();
    }

    #[test]
    fn a_wrong_workload_a_missing_family_or_a_wrong_type_is_named() {
        let text = worker_exposition("w");
        let e = exposition::parse(&text).unwrap();
        let err = check_exposition(&e, "other").unwrap_err();
        assert!(err.contains("expected \"other\""), "{err}");

        let without: String = text
            .lines()
            .filter(|l| !l.contains(m::PROBES_TOTAL.trim_end_matches("_total")))
            .map(|l| format!("{l}\n"))
            .collect();
        let err = check_exposition(&exposition::parse(&without).unwrap(), "w").unwrap_err();
        assert!(
            err.contains("backpressure_probes has no TYPE line"),
            "{err}"
        );

        let retyped = text.replace(
            &format!("# TYPE {} gauge", m::PERMITS),
            &format!("# TYPE {} counter", m::PERMITS),
        );
        let err = check_exposition(&exposition::parse(&retyped).unwrap(), "w").unwrap_err();
        assert!(err.contains("backpressure_permits is a counter"), "{err}");
    }
}
