//! Built-in defaults: the last step of the precedence (object, policies by priority, these).

use std::time::Duration;

/// Default set point: the failure rate treated as background noise.
pub const SET_POINT: f64 = 0.05;
/// Smallest set point accepted (at admission by the CRD's CEL rule, and by the operator for an
/// object stored before it): below it the controller backs off at almost every failure
/// (`setPoint: 1e-12` turns background noise into a full brake), which is never meant.
pub const MIN_SET_POINT: f64 = 1e-4;
/// Default maximum permits per pod.
pub const MAX_PERMITS: u32 = 16;
/// Smallest default reaction size.
pub const MIN_REACTION: u32 = 20;
/// Default first probe interval.
pub const PROBE_INITIAL: Duration = Duration::from_secs(2);
/// Default largest probe interval.
pub const PROBE_MAX: Duration = Duration::from_secs(60);
/// Default permits of a freshly started worker's controller, which ramps up from there to
/// `maxPermits` (the worker library's startup ramp; 0 starts at `maxPermits`). What the
/// simulator's workers use (`docs/sim/report.md`).
pub const INITIAL_PERMITS: u32 = 2;
/// Default sliding window of the `RatioThrottle` controller (grpc-go's adaptive throttler uses
/// 30 s).
pub const RATIO_WINDOW: Duration = Duration::from_secs(30);
/// Default time a full brake takes to lift when it expires or is lowered or removed (each pod
/// starts after its own random offset of up to half of it).
pub const BRAKE_RELEASE: Duration = Duration::from_secs(60);
/// Default highest failure floor the `SetPoint` controller may learn (failures that do not
/// respond to its concurrency): at a 25 % failure rate one message in 1000 fails all of 5
/// deliveries, whatever the concurrency.
pub const FLOOR_MAX: f64 = 0.25;
/// Largest failure floor accepted (the worker library clamps to it).
pub const MAX_FLOOR_MAX: f64 = 0.9;
/// Default redelivery delay after a failed first delivery (the worker library's redelivery
/// backoff: `base · 2^(k-1)` after the k-th failed delivery, at most [`REDELIVERY_MAX`]).
pub const REDELIVERY_BASE: Duration = Duration::from_secs(60);
/// Default longest redelivery delay.
pub const REDELIVERY_MAX: Duration = Duration::from_secs(480);
/// Default reaction size for a given maximum of permits: max(20, maxPermits).
pub const fn reaction(max_permits: u32) -> u32 {
    if max_permits > MIN_REACTION {
        max_permits
    } else {
        MIN_REACTION
    }
}

/// Default `rate()` window of the default queries.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Default staleness bound for samples.
pub const STALE_AFTER: Duration = Duration::from_secs(60);
/// Default staleness bound of the Pub/Sub preset's samples (Cloud Monitoring delivers them
/// minutes late, with their own timestamps).
pub const PUBSUB_STALE_AFTER: Duration = Duration::from_secs(300);
/// Default CloudWatch period of the SQS preset's sums.
pub const SQS_PERIOD: Duration = Duration::from_secs(60);
/// Shortest `rate()` window of the Pub/Sub preset (Cloud Monitoring samples once a minute).
pub const PUBSUB_MIN_RATE_WINDOW: Duration = Duration::from_secs(300);
/// Default Prometheus query timeout.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Default minimum replicas.
pub const MIN_REPLICAS: i32 = 1;
/// Default maximum replicas.
pub const MAX_REPLICAS: i32 = 10;
/// Default target queue age.
pub const TARGET_QUEUE_AGE: Duration = Duration::from_secs(60);
/// Default hold threshold on fleet backoff.
pub const HOLD_BACKOFF_ABOVE: f64 = 0.2;
/// Default time above the hold threshold before holding.
pub const HOLD_FOR: Duration = Duration::from_secs(30);
/// Default release threshold on fleet backoff.
pub const RELEASE_BACKOFF_BELOW: f64 = 0.05;
/// Default time below the release threshold before releasing.
pub const RELEASE_FOR: Duration = Duration::from_secs(60);
/// Default pods added per scale-up period.
pub const SCALE_UP_MAX_PODS: i32 = 4;
/// Default percent added per scale-up period.
pub const SCALE_UP_MAX_PERCENT: i32 = 100;
/// Default scale-up period.
pub const SCALE_UP_PERIOD: Duration = Duration::from_secs(15);
/// Default percent removed per scale-down period.
pub const SCALE_DOWN_MAX_PERCENT: i32 = 10;
/// Default scale-down period.
pub const SCALE_DOWN_PERIOD: Duration = Duration::from_secs(60);
/// Default scale-down stabilization window.
pub const SCALE_DOWN_STABILIZATION: Duration = Duration::from_secs(300);
/// Default ramp stages, percent of the way to the target.
pub const RAMP_STAGES: [i32; 4] = [25, 50, 75, 100];
/// Default dwell per ramp stage.
pub const RAMP_DWELL: Duration = Duration::from_secs(60);
/// Default ramp abort threshold on fleet backoff.
pub const RAMP_ABORT_ABOVE: f64 = 0.2;

/// Default time producers stay paused or throttled before resuming.
pub const PRODUCER_PAUSE_DWELL: Duration = Duration::from_secs(60);
/// Default time at each step of the way back to open producers.
pub const PRODUCER_RESUME_DWELL: Duration = Duration::from_secs(60);
