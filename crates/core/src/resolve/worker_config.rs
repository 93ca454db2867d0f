//! The worker configuration payload of the wire contract, rendered from an [`Effective`], and
//! its generation.

use std::time::Duration;

use backpressure_api::wire::{BrakeConfig, RedeliveryConfig, WIRE_VERSION, WorkerConfig};
use k8s_openapi::jiff::Timestamp;

use super::Effective;

/// The generation of the worker configuration whose content hash is `hash`, given the previous
/// one (hash and generation, from status) at `now`.
///
/// The same content keeps its generation. New content gets the larger of the previous
/// generation + 1 and the Unix time in milliseconds, so generations keep growing across a recreated
/// object or a lost status: workers refuse a generation older than the one they run, and a
/// counter that restarted at 1 would be refused by every pod until it restarted.
pub fn next_config_generation(previous: Option<(&str, i64)>, hash: &str, now: Timestamp) -> i64 {
    match previous {
        Some((h, generation)) if h == hash => generation,
        Some((_, generation)) => generation.saturating_add(1).max(now.as_millisecond()),
        None => now.as_millisecond().max(1),
    }
}

/// Renders the worker configuration payload (wire contract) with its hash.
///
/// `set_point` is the one the workers run: `effective.worker.set_point`, or above it while the
/// fleet has a failure floor (`decide::worker_set_point`). `generation` must grow whenever the
/// payload changes ([`next_config_generation`]); workers refuse a generation older than the one
/// they run.
pub fn render_worker_config(
    effective: &Effective,
    set_point: f64,
    generation: i64,
) -> WorkerConfig {
    let w = &effective.worker;
    WorkerConfig {
        version: WIRE_VERSION.to_owned(),
        generation,
        hash: String::new(),
        algorithm: w.algorithm,
        set_point,
        reaction: w.reaction,
        max_permits: w.max_permits,
        probe_initial_ms: millis(w.probe_initial).max(1),
        probe_max_ms: millis(w.probe_max).max(millis(w.probe_initial).max(1)),
        initial_permits: w.initial_permits,
        ratio_window_ms: w.ratio_window.map(|d| millis(d).max(1)),
        brake_release_ms: w.brake_release.map(millis),
        floor_max: w.floor_max,
        redelivery: w.redelivery.map(|(base, max)| RedeliveryConfig {
            base_ms: millis(base),
            max_ms: millis(max).max(millis(base)),
        }),
        brake: effective.brake.as_ref().map(|b| BrakeConfig {
            min_backoff: b.min_backoff,
            expires_at_unix: b.expires_at.map(Timestamp::as_second),
        }),
    }
    .with_hash()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
