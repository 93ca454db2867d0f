//! The producer: adds messages to the queue at the scenario's rate schedule.

use std::time::Duration;

use tokio::time::Instant;

use crate::queue::Queue;
use crate::scenario::Schedule;

/// How many messages are due in a tick: the integral of the rate plus the fraction carried
/// from earlier ticks. Pure; returns (messages, new carry).
pub fn due(rate: f64, dt_secs: f64, carry: f64) -> (u64, f64) {
    let total = carry + (rate.max(0.0) * dt_secs.max(0.0));
    let n = total.floor();
    (n as u64, total - n)
}

/// Produces until `until` (time since `start`), ticking every 50 ms. Returns the number of
/// messages produced. Errors are logged and retried on the next tick (the count stays exact:
/// a failed batch is not counted and its messages are due again).
pub async fn run(queue: Queue, rate: Schedule, start: Instant, until: Duration) -> u64 {
    let tick = Duration::from_millis(50);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut carry = 0.0;
    let mut last = start;
    let mut produced = 0u64;
    let mut seq = 0u64;
    let mut owed = 0u64;
    loop {
        interval.tick().await;
        let now = Instant::now();
        let t = now.duration_since(start);
        if t >= until {
            break;
        }
        let (n, c) = due(rate.value_at(t), (now - last).as_secs_f64(), carry);
        carry = c;
        last = now;
        owed += n;
        if owed == 0 {
            continue;
        }
        let bodies: Vec<String> = (seq..seq + owed).map(|i| format!("msg-{i}")).collect();
        match queue.produce(&bodies).await {
            Ok(()) => {
                seq += owed;
                produced += owed;
                owed = 0;
            }
            Err(e) => tracing::warn!(error = %e, "producer: batch failed, retrying"),
        }
    }
    produced
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_fractions() {
        let mut carry = 0.0;
        let mut total = 0;
        for _ in 0..200 {
            let (n, c) = due(7.0, 0.05, carry);
            carry = c;
            total += n;
        }
        // 7/s for 10 s.
        assert!((69..=70).contains(&total), "{total}");
        assert_eq!(due(0.0, 1.0, 0.5), (0, 0.5));
        assert_eq!(due(-3.0, 1.0, 0.0).0, 0);
    }
}
