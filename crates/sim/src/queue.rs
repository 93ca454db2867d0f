//! The queue: at-least-once delivery with redelivery after a visibility timeout and a
//! dead-letter queue after `maxReceives` failed deliveries.
//!
//! Messages are fungible except for what the model needs of each one: its arrival time (until
//! its first delivery, for the first-attempt age) and its delivery count (for the DLQ). So the
//! queue keeps run-length encoded buckets instead of one record per message:
//!
//! - `fresh`: never-delivered messages, one bucket per arrival tick, FIFO;
//! - `retry`: failed messages waiting to become visible again, one bucket per (visible tick,
//!   delivery count), in the order they become visible. A failed message is visible again after
//!   the delay for its delivery count: the visibility timeout, or with the worker library's
//!   redelivery backoff (`ChangeMessageVisibility` on failure) a delay growing with the count.
//!
//! A receive takes visible retries first (they are the oldest messages, and SQS serves roughly
//! oldest first), then fresh messages. Every message keeps its exact delivery count, so the DLQ
//! is exact per message, not a probability estimate.

use std::collections::{BTreeMap, VecDeque};

use crate::stats::Histogram;

#[derive(Clone, Copy, Debug)]
struct FreshBucket {
    arrived: u64,
    n: u64,
}

/// The queue and its counters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Queue {
    fresh: VecDeque<FreshBucket>,
    fresh_len: u64,
    /// (visible tick, delivery count) -> messages.
    retry: BTreeMap<(u64, u8), u64>,
    retry_len: u64,
    /// Delay in ticks after the k-th failed delivery, at index k-1 (the last one repeats).
    retry_delays: Vec<u64>,
    max_receives: u8,
    /// Messages produced so far.
    pub produced: u64,
    /// Messages acknowledged (processed successfully).
    pub completed: u64,
    /// Messages moved to the DLQ.
    pub dead_lettered: u64,
    /// Deliveries (receives) so far.
    pub deliveries: u64,
    /// Histogram of each message's wait before its first delivery, in ticks.
    pub first_wait: Histogram,
}

impl Queue {
    /// An empty queue. A failed message becomes visible `retry_delay` ticks after its failure;
    /// a message whose `max_receives`-th delivery fails goes to the DLQ.
    pub fn new(retry_delay: u64, max_receives: u8) -> Self {
        Self::with_delays(vec![retry_delay], max_receives)
    }

    /// Like [`Queue::new`], with the delay after the k-th failed delivery at `delays[k - 1]`
    /// (the last entry for later ones).
    pub fn with_delays(delays: Vec<u64>, max_receives: u8) -> Self {
        let mut retry_delays: Vec<u64> = delays.into_iter().map(|d| d.max(1)).collect();
        if retry_delays.is_empty() {
            retry_delays.push(1);
        }
        Queue {
            fresh: VecDeque::new(),
            fresh_len: 0,
            retry: BTreeMap::new(),
            retry_len: 0,
            retry_delays,
            max_receives: max_receives.max(1),
            produced: 0,
            completed: 0,
            dead_lettered: 0,
            deliveries: 0,
            first_wait: Histogram::new(),
        }
    }

    /// `n` messages arrive at `now`.
    pub fn arrive(&mut self, now: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.produced += n;
        self.fresh_len += n;
        match self.fresh.back_mut() {
            Some(b) if b.arrived == now => b.n += n,
            _ => self.fresh.push_back(FreshBucket { arrived: now, n }),
        }
    }

    /// Whether a receive at `now` would return anything.
    pub fn has_visible(&self, now: u64) -> bool {
        self.fresh_len > 0
            || self
                .retry
                .first_key_value()
                .is_some_and(|((at, _), _)| *at <= now)
    }

    /// Receives up to `k` messages at `now`, calling `deliver(count)` with each message's
    /// delivery count (1 for a first delivery). Returns how many were received.
    pub fn receive(&mut self, now: u64, k: u64, mut deliver: impl FnMut(u8)) -> u64 {
        let mut taken = 0;
        while taken < k {
            let Some(mut front) = self.retry.first_entry() else {
                break;
            };
            let (visible_at, deliveries) = *front.key();
            if visible_at > now {
                break;
            }
            let n = front.get_mut();
            let m = (*n).min(k - taken);
            let count = deliveries.saturating_add(1);
            for _ in 0..m {
                deliver(count);
            }
            *n -= m;
            self.retry_len -= m;
            taken += m;
            if *n == 0 {
                front.remove();
            }
        }
        while taken < k {
            let Some(front) = self.fresh.front_mut() else {
                break;
            };
            let m = front.n.min(k - taken);
            self.first_wait.add(now - front.arrived, m);
            for _ in 0..m {
                deliver(1);
            }
            front.n -= m;
            self.fresh_len -= m;
            taken += m;
            if front.n == 0 {
                self.fresh.pop_front();
            }
        }
        self.deliveries += taken;
        taken
    }

    /// A delivered message was processed: delete it.
    pub fn ack(&mut self) {
        self.completed += 1;
    }

    /// The `deliveries`-th delivery of a message failed at `now`. Returns true when the message
    /// went to the DLQ.
    pub fn nack(&mut self, now: u64, deliveries: u8) -> bool {
        if deliveries >= self.max_receives {
            self.dead_lettered += 1;
            return true;
        }
        let i = usize::from(deliveries.max(1) - 1).min(self.retry_delays.len() - 1);
        let visible_at = now + self.retry_delays[i];
        self.retry_len += 1;
        *self.retry.entry((visible_at, deliveries)).or_insert(0) += 1;
        false
    }

    /// Age in ticks at `now` of the oldest message that has not had its first delivery
    /// (0 when there is none).
    pub fn oldest_first_attempt_age(&self, now: u64) -> u64 {
        self.fresh
            .front()
            .map_or(0, |b| now.saturating_sub(b.arrived))
    }

    /// Messages waiting: never delivered plus waiting for redelivery (visible or not).
    pub fn depth(&self) -> u64 {
        self.fresh_len + self.retry_len
    }

    /// Messages waiting for redelivery.
    pub fn retry_depth(&self) -> u64 {
        self.retry_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_first_attempt_age_and_wait_histogram() {
        let mut q = Queue::new(300, 5);
        q.arrive(0, 3);
        q.arrive(10, 2);
        assert_eq!(q.depth(), 5);
        assert_eq!(q.oldest_first_attempt_age(25), 25);
        let mut got = Vec::new();
        assert_eq!(q.receive(25, 4, |c| got.push(c)), 4);
        assert_eq!(got, vec![1, 1, 1, 1]);
        assert_eq!(q.oldest_first_attempt_age(25), 15);
        assert_eq!(q.first_wait.count(), 4);
        assert_eq!(q.first_wait.max(), 25);
    }

    #[test]
    fn failed_messages_come_back_after_the_delay_first_and_then_dead_letter() {
        let mut q = Queue::new(300, 3);
        q.arrive(0, 2);
        let mut counts = Vec::new();
        q.receive(0, 1, |c| counts.push(c));
        assert!(!q.nack(5, 1));
        // Not visible yet: the fresh message comes out.
        q.receive(100, 5, |c| counts.push(c));
        assert_eq!(counts, vec![1, 1]);
        assert!(!q.has_visible(304));
        assert!(q.has_visible(305));
        q.receive(305, 5, |c| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2]);
        assert!(!q.nack(310, 2));
        q.receive(610, 5, |c| counts.push(c));
        assert!(q.nack(611, 3));
        assert_eq!(q.dead_lettered, 1);
        assert_eq!(q.depth(), 0);
        assert_eq!(q.deliveries, 4);
    }

    #[test]
    fn redelivery_delay_grows_with_the_delivery_count_and_earliest_comes_first() {
        let mut q = Queue::with_delays(vec![10, 20, 40], 5);
        q.arrive(0, 2);
        let mut counts = Vec::new();
        q.receive(0, 2, |c| counts.push(c));
        assert!(!q.nack(0, 1)); // visible at 10
        q.receive(10, 1, |c| counts.push(c));
        assert!(!q.nack(10, 2)); // visible at 30
        assert!(!q.nack(12, 1)); // the other one, visible at 22: before the first
        assert!(!q.has_visible(21));
        q.receive(22, 5, |c| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2, 2]);
        assert!(!q.has_visible(29));
        q.receive(30, 5, |c| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2, 2, 3]);
        assert!(!q.nack(30, 3)); // visible at 70
        assert!(!q.nack(30, 2)); // visible at 50
        assert!(!q.nack(31, 4)); // past the list: the last delay, visible at 71
        let mut order = Vec::new();
        q.receive(100, 5, |c| order.push(c));
        assert_eq!(order, vec![3, 4, 5]);
    }
}
