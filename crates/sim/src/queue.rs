//! The queue: at-least-once delivery with redelivery after a visibility timeout and a
//! dead-letter queue after `maxReceives` failed deliveries.
//!
//! Messages are fungible except for what the model needs of each one: its arrival time (until
//! its first delivery, for the first-attempt age), its delivery count (for the DLQ) and the
//! time its producer wanted to send it, its *demand* time (for the end-to-end age at
//! completion, which counts a wait at a gated producer). So the queue keeps run-length encoded
//! buckets instead of one record per message:
//!
//! - `fresh`: never-delivered messages, one bucket per (arrival tick, demand tick), FIFO;
//! - `retry`: failed messages waiting to become visible again, one bucket per (visible tick,
//!   delivery count, demand second), in the order they become visible. A failed message is
//!   visible again after the delay for its delivery count: the visibility timeout, or with the
//!   worker library's redelivery backoff (`ChangeMessageVisibility` on failure) a delay growing
//!   with the count. The demand time of a redelivered message is kept to the second (the
//!   buckets stay few when a fleet fails hundreds of messages a second).
//!
//! A receive takes visible retries first (they are the oldest messages, and SQS serves roughly
//! oldest first), then fresh messages. Every message keeps its exact delivery count, so the DLQ
//! is exact per message, not a probability estimate.

use std::collections::{BTreeMap, VecDeque};

use crate::stats::Histogram;

#[derive(Clone, Copy, Debug)]
struct FreshBucket {
    arrived: u64,
    born: u64,
    n: u64,
}

/// The queue and its counters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Queue {
    fresh: VecDeque<FreshBucket>,
    fresh_len: u64,
    /// (visible tick, delivery count, demand tick rounded down to `born_grain`) -> messages.
    retry: BTreeMap<(u64, u8, u64), u64>,
    /// Ticks per second: the resolution of a redelivered message's demand time.
    born_grain: u64,
    retry_len: u64,
    /// Delay in ticks after the k-th failed delivery, at index k-1 (the last one repeats).
    retry_delays: Vec<u64>,
    max_receives: u8,
    /// The most messages stored (waiting plus delivered and not acknowledged); `None`: no limit.
    capacity: Option<u64>,
    /// Messages produced so far (accepted by the broker).
    pub produced: u64,
    /// Publishes refused because the broker was full.
    pub rejected: u64,
    /// Messages acknowledged (processed successfully).
    pub completed: u64,
    /// Messages moved to the DLQ.
    pub dead_lettered: u64,
    /// Deliveries (receives) so far.
    pub deliveries: u64,
    /// Histogram of each message's wait before its first delivery, in ticks.
    pub first_wait: Histogram,
    /// Histogram of each completed message's time from demand to acknowledgement, in ticks.
    pub end_to_end: Histogram,
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
            born_grain: 1,
            retry_len: 0,
            retry_delays,
            max_receives: max_receives.max(1),
            capacity: None,
            produced: 0,
            rejected: 0,
            completed: 0,
            dead_lettered: 0,
            deliveries: 0,
            first_wait: Histogram::new(),
            end_to_end: Histogram::new(),
        }
    }

    /// Keeps the demand time of redelivered messages to multiples of `ticks` (one second).
    pub fn with_born_grain(mut self, ticks: u64) -> Self {
        self.born_grain = ticks.max(1);
        self
    }

    /// Limits the messages stored to `capacity` (`None`: no limit).
    pub fn with_capacity(mut self, capacity: Option<u64>) -> Self {
        self.capacity = capacity;
        self
    }

    /// How many more messages the broker accepts now, with `in_flight` delivered messages not
    /// yet acknowledged (it keeps them until the ack).
    pub fn room(&self, in_flight: u64) -> u64 {
        self.capacity
            .map_or(u64::MAX, |c| c.saturating_sub(self.depth() + in_flight))
    }

    /// Publishes `n` messages demanded at `born` at `now`, with `in_flight` delivered messages
    /// not yet acknowledged: the broker accepts what fits ([`Queue::room`]) and rejects the rest
    /// (counted in [`Queue::rejected`]). Returns how many were accepted.
    pub fn publish(&mut self, now: u64, born: u64, n: u64, in_flight: u64) -> u64 {
        let accepted = n.min(self.room(in_flight));
        self.rejected += n - accepted;
        self.arrive_born(now, born, accepted);
        accepted
    }

    /// `n` messages demanded at `now` arrive at `now`.
    pub fn arrive(&mut self, now: u64, n: u64) {
        self.arrive_born(now, now, n);
    }

    /// `n` messages demanded at `born` (<= `now`; earlier when they waited at the producer)
    /// arrive at `now`.
    pub fn arrive_born(&mut self, now: u64, born: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.produced += n;
        self.fresh_len += n;
        match self.fresh.back_mut() {
            Some(b) if b.arrived == now && b.born == born => b.n += n,
            _ => self.fresh.push_back(FreshBucket {
                arrived: now,
                born,
                n,
            }),
        }
    }

    /// Whether a receive at `now` would return anything.
    pub fn has_visible(&self, now: u64) -> bool {
        self.fresh_len > 0
            || self
                .retry
                .first_key_value()
                .is_some_and(|((at, _, _), _)| *at <= now)
    }

    /// Receives up to `k` messages at `now`, calling `deliver(count, born)` with each message's
    /// delivery count (1 for a first delivery) and demand time. Returns how many were received.
    pub fn receive(&mut self, now: u64, k: u64, mut deliver: impl FnMut(u8, u64)) -> u64 {
        let mut taken = 0;
        while taken < k {
            let Some(mut front) = self.retry.first_entry() else {
                break;
            };
            let (visible_at, deliveries, born) = *front.key();
            if visible_at > now {
                break;
            }
            let n = front.get_mut();
            let m = (*n).min(k - taken);
            let count = deliveries.saturating_add(1);
            for _ in 0..m {
                deliver(count, born);
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
                deliver(1, front.born);
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

    /// A message demanded at `born` was processed at `now`: delete it.
    pub fn ack(&mut self, now: u64, born: u64) {
        self.completed += 1;
        self.end_to_end.add(now.saturating_sub(born), 1);
    }

    /// The `deliveries`-th delivery of a message demanded at `born` failed at `now`. Returns
    /// true when the message went to the DLQ.
    pub fn nack(&mut self, now: u64, deliveries: u8, born: u64) -> bool {
        if deliveries >= self.max_receives {
            self.dead_lettered += 1;
            return true;
        }
        let i = usize::from(deliveries.max(1) - 1).min(self.retry_delays.len() - 1);
        let visible_at = now + self.retry_delays[i];
        self.retry_len += 1;
        let born = born - born % self.born_grain;
        *self
            .retry
            .entry((visible_at, deliveries, born))
            .or_insert(0) += 1;
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

    /// Messages never delivered (fresh): a Redis Streams consumer group's `lag` (entries after
    /// the group's last-delivered ID), which leaves out the messages waiting for redelivery
    /// (in a stream's pending list).
    pub fn undelivered(&self) -> u64 {
        self.fresh_len
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
    fn a_full_broker_rejects_what_does_not_fit_and_counts_unacknowledged_messages() {
        let mut q = Queue::new(300, 5).with_capacity(Some(10));
        assert_eq!(q.publish(0, 0, 6, 0), 6);
        // 6 waiting + 3 delivered and not acknowledged: room for one.
        assert_eq!(q.room(3), 1);
        assert_eq!(q.publish(1, 1, 4, 3), 1);
        assert_eq!((q.produced, q.rejected, q.depth()), (7, 3, 7));
        // Never beyond the capacity, whatever is offered.
        for t in 2..50 {
            q.publish(t, t, 1000, 3);
            assert!(q.depth() + 3 <= 10, "t={t}: {}", q.depth());
        }
        // A redelivery needs no room: the message is already stored.
        let mut got = 0;
        q.receive(50, 1, |_, _| got += 1);
        assert!(!q.nack(51, 1, 0));
        assert_eq!(q.depth() + 3, 10);
        // Without a capacity nothing is rejected.
        let mut u = Queue::new(300, 5);
        assert_eq!(u.publish(0, 0, 1_000_000, 1_000_000), 1_000_000);
        assert_eq!(u.rejected, 0);
    }

    #[test]
    fn end_to_end_age_counts_from_the_demand_through_redeliveries() {
        let mut q = Queue::new(30, 5).with_born_grain(10);
        // Demanded at 5, published at 100 (it waited at the producer).
        q.arrive_born(100, 5, 1);
        assert_eq!(q.oldest_first_attempt_age(100), 0);
        let mut born = Vec::new();
        q.receive(100, 1, |_, b| born.push(b));
        assert_eq!(born, vec![5]);
        assert!(!q.nack(110, 1, 5));
        born.clear();
        q.receive(140, 1, |_, b| born.push(b));
        // Redelivered: the demand time to the grain (10 ticks).
        assert_eq!(born, vec![0]);
        q.ack(200, 5);
        assert_eq!(q.end_to_end.max(), 195);
        assert_eq!(q.first_wait.max(), 0);
    }

    #[test]
    fn fifo_first_attempt_age_and_wait_histogram() {
        let mut q = Queue::new(300, 5);
        q.arrive(0, 3);
        q.arrive(10, 2);
        assert_eq!(q.depth(), 5);
        assert_eq!(q.oldest_first_attempt_age(25), 25);
        let mut got = Vec::new();
        assert_eq!(q.receive(25, 4, |c, _| got.push(c)), 4);
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
        q.receive(0, 1, |c, _| counts.push(c));
        assert!(!q.nack(5, 1, 0));
        // Not visible yet: the fresh message comes out.
        q.receive(100, 5, |c, _| counts.push(c));
        assert_eq!(counts, vec![1, 1]);
        assert!(!q.has_visible(304));
        assert!(q.has_visible(305));
        q.receive(305, 5, |c, _| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2]);
        assert!(!q.nack(310, 2, 0));
        q.receive(610, 5, |c, _| counts.push(c));
        assert!(q.nack(611, 3, 0));
        assert_eq!(q.dead_lettered, 1);
        assert_eq!(q.depth(), 0);
        assert_eq!(q.deliveries, 4);
    }

    #[test]
    fn redelivery_delay_grows_with_the_delivery_count_and_earliest_comes_first() {
        let mut q = Queue::with_delays(vec![10, 20, 40], 5);
        q.arrive(0, 2);
        let mut counts = Vec::new();
        q.receive(0, 2, |c, _| counts.push(c));
        assert!(!q.nack(0, 1, 0)); // visible at 10
        q.receive(10, 1, |c, _| counts.push(c));
        assert!(!q.nack(10, 2, 0)); // visible at 30
        assert!(!q.nack(12, 1, 0)); // the other one, visible at 22: before the first
        assert!(!q.has_visible(21));
        q.receive(22, 5, |c, _| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2, 2]);
        assert!(!q.has_visible(29));
        q.receive(30, 5, |c, _| counts.push(c));
        assert_eq!(counts, vec![1, 1, 2, 2, 3]);
        assert!(!q.nack(30, 3, 0)); // visible at 70
        assert!(!q.nack(30, 2, 0)); // visible at 50
        assert!(!q.nack(31, 4, 0)); // past the list: the last delay, visible at 71
        let mut order = Vec::new();
        q.receive(100, 5, |c, _| order.push(c));
        assert_eq!(order, vec![3, 4, 5]);
    }
}
