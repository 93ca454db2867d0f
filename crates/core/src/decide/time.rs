//! Instant arithmetic on `jiff::Timestamp` (the type inside `metav1.Time`), saturating instead
//! of failing. Everything `decide` writes is truncated to whole seconds, because `metav1.Time`
//! serializes without fractions: a status read back from the API server must equal the one
//! that was written.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// `t` without its fraction of a second.
pub fn truncate(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_millis(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(if ms > 0 {
        Timestamp::MAX
    } else {
        Timestamp::MIN
    })
}

/// `t + d`, rounded up to a whole second so a deadline is never announced early.
pub fn plus(t: Timestamp, d: Duration) -> Timestamp {
    let ms = t.as_millisecond().saturating_add(millis(d));
    let secs = ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0);
    Timestamp::from_second(secs).unwrap_or_else(|_| from_millis(ms))
}

/// `t - d`.
pub fn minus(t: Timestamp, d: Duration) -> Timestamp {
    from_millis(t.as_millisecond().saturating_sub(millis(d)))
}

/// Whether at least `d` has passed from `since` to `now`.
pub fn elapsed_at_least(since: Timestamp, now: Timestamp, d: Duration) -> bool {
    now.as_millisecond().saturating_sub(since.as_millisecond()) >= millis(d)
}

/// Time from `since` to `now` (zero if `now` is earlier).
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let ms = now.as_millisecond().saturating_sub(since.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Time from `now` until `deadline` (zero if it has passed).
pub fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    elapsed(now, deadline)
}

/// A duration for humans, Go style (`45s`, `1m30s`).
pub fn human(d: Duration) -> String {
    backpressure_api::duration::format_duration(Duration::from_secs(d.as_secs()))
}
