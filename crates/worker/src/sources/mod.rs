//! [`Source`](crate::worker_loop::Source)s for real queues, each behind a cargo feature that is
//! off by default (its client library is a dependency only when the feature is on).

#[cfg(feature = "redis-streams")]
pub mod redis_streams;
#[cfg(feature = "sqs")]
pub mod sqs;
