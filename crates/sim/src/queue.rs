//! The queue: at-least-once delivery with redelivery after a visibility timeout and a
//! dead-letter queue after `maxReceives` failed deliveries.
//!
//! Messages are fungible except for what the model needs of each one: its arrival time (until
//! its first delivery, for the first-attempt age) and its delivery count (for the DLQ). So the
//! queue keeps run-length encoded buckets instead of one record per message:
//!
//! - `fresh`: never-delivered messages, one bucket per arrival tick, FIFO;
//! - `retry`: failed messages waiting to become visible again, one bucket per (visible tick,
//!   delivery count), in the order they become visible.
//!
//! A receive takes visible retries first (they are the oldest messages, and SQS serves roughly
//! oldest first), then fresh messages. Every message keeps its exact delivery count, so the DLQ
//! is exact per message, not a probability estimate.

use std::collections::VecDeque;

use crate::stats::Histogram;

#[derive(Clone, Copy, Debug)]
struct FreshBucket {
    arrived: u64,
    n: u64,
}

#[derive(Clone, Copy, Debug)]
struct RetryBucket {
    visible_at: u64,
    deliveries: u8,
    n: u64,
}

/// The queue and its counters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Queue {
    fresh: VecDeque<FreshBucket>,
    fresh_len: u64,
    retry: VecDeque<RetryBucket>,
    retry_len: u64,
    retry_delay: u64,
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
        Queue {
            fresh: VecDeque::new(),
            fresh_len: 0,
            retry: VecDeque::new(),
            retry_len: 0,
            retry_delay: retry_delay.max(1),
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
        self.fresh_len > 0 || self.retry.front().is_some_and(|b| b.visible_at <= now)
    }

    /// Receives up to `k` messages at `now`, calling `deliver(count)` with each message's
    /// delivery count (1 for a first delivery). Returns how many were received.
    pub fn receive(&mut self, now: u64, k: u64, mut deliver: impl FnMut(u8)) -> u64 {
        let mut taken = 0;
        while taken < k {
            let Some(front) = self.retry.front_mut() else {
                break;
            };
            if front.visible_at > now {
                break;
            }
            let m = front.n.min(k - taken);
            let count = front.deliveries.saturating_add(1);
            for _ in 0..m {
                deliver(count);
            }
            front.n -= m;
            self.retry_len -= m;
            taken += m;
            if front.n == 0 {
                self.retry.pop_front();
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
        let visible_at = now + self.retry_delay;
        self.retry_len += 1;
        match self.retry.back_mut() {
            Some(b) if b.visible_at == visible_at && b.deliveries == deliveries => b.n += 1,
            _ => self.retry.push_back(RetryBucket {
                visible_at,
                deliveries,
                n: 1,
            }),
        }
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
}
