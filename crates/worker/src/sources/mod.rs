//! [`crate::worker_loop::Source`]s for real queues, each behind a cargo feature.

#[cfg(feature = "sqs")]
pub mod sqs;
