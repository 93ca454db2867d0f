//! The producers of a run with producer control (issue 17): the scenario's arrival process is
//! their demand, and a gate set by the operator's producer decision
//! (`backpressure_core::producers::decide_producers`) decides what they publish.
//!
//! A message the gate does not admit waits at the producer, in a FIFO backlog, and is
//! published when admitted: the gate never drops a message. A message the broker rejects
//! (full, `queue.capacity`) stays at the head of that backlog and is offered again on the next
//! tick: a producer honouring a gate keeps what it could not hand over. Without producer
//! control there is no backlog: the demand is published as it comes, and what the broker
//! rejects is lost (the engine publishes directly).
//!
//! The gate follows the decided state: `Open` admits everything, `Paused` nothing,
//! `Throttled` and `Resuming` at most the decided rate for the whole workload, through a token
//! bucket holding at most [`BURST_SECS`] of that rate (at least one message).

use std::collections::VecDeque;

use backpressure_api::v1alpha1::ProducerState;

/// Depth of the token bucket of a rate-limited gate, in seconds of the rate.
pub const BURST_SECS: f64 = 1.0;

/// What the gate admits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gate {
    /// Everything.
    Open,
    /// Nothing.
    Paused,
    /// At most this many messages per second.
    Rate(f64),
}

impl Gate {
    /// The gate for a decided producer state and rate (`Throttled` and `Resuming` without a
    /// rate admit nothing).
    pub fn from_state(state: ProducerState, rate: Option<f64>) -> Gate {
        match state {
            ProducerState::Open => Gate::Open,
            ProducerState::Paused => Gate::Paused,
            ProducerState::Throttled | ProducerState::Resuming => {
                Gate::Rate(rate.filter(|r| r.is_finite()).unwrap_or(0.0).max(0.0))
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    born: u64,
    n: u64,
}

/// The producer workload: its backlog of messages demanded and not yet published, and its
/// gate.
#[derive(Clone, Debug)]
pub struct Producers {
    backlog: VecDeque<Bucket>,
    len: u64,
    gate: Gate,
    tokens: f64,
    /// Messages demanded so far.
    pub demanded: u64,
    /// Messages published (accepted by the broker) so far.
    pub published: u64,
}

impl Default for Producers {
    fn default() -> Self {
        Producers::new()
    }
}

impl Producers {
    /// Producers with an open gate and no backlog.
    pub fn new() -> Self {
        Producers {
            backlog: VecDeque::new(),
            len: 0,
            gate: Gate::Open,
            tokens: 0.0,
            demanded: 0,
            published: 0,
        }
    }

    /// The gate in force.
    pub fn gate(&self) -> Gate {
        self.gate
    }

    /// Sets the gate. A rate-limited gate entered from another kind starts with an empty
    /// bucket; a rate change keeps the tokens up to the new bucket's depth.
    pub fn set_gate(&mut self, gate: Gate) {
        match (self.gate, gate) {
            (Gate::Rate(_), Gate::Rate(r)) => self.tokens = self.tokens.min(burst(r)),
            _ => self.tokens = 0.0,
        }
        self.gate = gate;
    }

    /// `n` messages are demanded at `now` (in ticks).
    pub fn demand(&mut self, now: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.demanded += n;
        self.len += n;
        match self.backlog.back_mut() {
            Some(b) if b.born == now => b.n += n,
            _ => self.backlog.push_back(Bucket { born: now, n }),
        }
    }

    /// One tick of `dt` seconds: offers what the gate admits, oldest first, to `publish(born,
    /// n)`, which returns how many of the `n` the broker accepted. What the broker refuses
    /// stays at the head of the backlog until the next tick. Returns the messages accepted.
    pub fn send(&mut self, dt: f64, mut publish: impl FnMut(u64, u64) -> u64) -> u64 {
        let mut allowed = match self.gate {
            Gate::Open => u64::MAX,
            Gate::Paused => 0,
            Gate::Rate(r) => {
                self.tokens = (self.tokens + r * dt).min(burst(r));
                self.tokens.floor() as u64
            }
        };
        let mut accepted = 0;
        while allowed > 0 {
            let Some(front) = self.backlog.front_mut() else {
                break;
            };
            let m = front.n.min(allowed);
            let got = publish(front.born, m).min(m);
            front.n -= got;
            accepted += got;
            allowed -= got;
            if front.n == 0 {
                self.backlog.pop_front();
            }
            if got < m {
                break;
            }
        }
        self.len -= accepted;
        self.published += accepted;
        if let Gate::Rate(_) = self.gate {
            self.tokens -= accepted as f64;
        }
        accepted
    }

    /// Messages waiting at the producers.
    pub fn backlog(&self) -> u64 {
        self.len
    }

    /// Age in ticks at `now` of the oldest message waiting at the producers (0 when none).
    pub fn oldest_age(&self, now: u64) -> u64 {
        self.backlog
            .front()
            .map_or(0, |b| now.saturating_sub(b.born))
    }
}

fn burst(rate: f64) -> f64 {
    (rate * BURST_SECS).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker that accepts at most `room` messages in all.
    fn broker(room: &mut u64, log: &mut Vec<(u64, u64)>) -> impl FnMut(u64, u64) -> u64 {
        move |born, n| {
            let got = n.min(*room);
            *room -= got;
            log.push((born, got));
            got
        }
    }

    #[test]
    fn open_passes_everything_paused_nothing_and_nothing_is_lost() {
        let mut p = Producers::new();
        let mut room = u64::MAX;
        let mut log = Vec::new();
        p.demand(0, 5);
        assert_eq!(p.send(0.1, broker(&mut room, &mut log)), 5);
        p.set_gate(Gate::Paused);
        for t in 1..=100 {
            p.demand(t, 3);
            assert_eq!(p.send(0.1, broker(&mut room, &mut log)), 0);
        }
        assert_eq!(p.backlog(), 300);
        assert_eq!(p.oldest_age(100), 99);
        p.set_gate(Gate::Open);
        assert_eq!(p.send(0.1, broker(&mut room, &mut log)), 300);
        // Every message demanded was published once, oldest first.
        assert_eq!((p.demanded, p.published, p.backlog()), (305, 305, 0));
        let borns: Vec<u64> = log
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(b, _)| *b)
            .collect();
        assert!(borns.windows(2).all(|w| w[0] <= w[1]), "{borns:?}");
    }

    #[test]
    fn a_rate_gate_admits_its_rate_with_a_one_second_burst() {
        let mut p = Producers::new();
        p.set_gate(Gate::Rate(20.0));
        let mut room = u64::MAX;
        let mut log = Vec::new();
        p.demand(0, 10_000);
        // 100 s at 10 ticks per second: 20 messages per second, no more.
        let mut sent = 0;
        for _ in 0..1000 {
            sent += p.send(0.1, broker(&mut room, &mut log));
        }
        assert!((1990..=2000).contains(&sent), "{sent}");
        // After an idle stretch, at most one second of the rate at once.
        let mut idle = Producers::new();
        idle.set_gate(Gate::Rate(20.0));
        for _ in 0..100 {
            idle.send(0.1, broker(&mut room, &mut log));
        }
        idle.demand(100, 1000);
        assert_eq!(idle.send(0.1, broker(&mut room, &mut log)), 20);
        // A small rate still gets a message through.
        let mut slow = Producers::new();
        slow.set_gate(Gate::Rate(0.5));
        slow.demand(0, 10);
        let got: u64 = (0..30)
            .map(|_| slow.send(0.1, broker(&mut room, &mut log)))
            .sum();
        assert_eq!(got, 1);
    }

    #[test]
    fn what_the_broker_refuses_stays_at_the_producer() {
        let mut p = Producers::new();
        let mut room = 7;
        let mut log = Vec::new();
        p.demand(0, 5);
        p.demand(1, 5);
        assert_eq!(p.send(0.1, broker(&mut room, &mut log)), 7);
        assert_eq!(p.backlog(), 3);
        // The refused messages are the newest three, still held; they go when there is room.
        let mut room = 100;
        assert_eq!(p.send(0.1, broker(&mut room, &mut log)), 3);
        assert_eq!((p.demanded, p.published, p.backlog()), (10, 10, 0));
    }
}
