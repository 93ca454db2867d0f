//! [`Source`](crate::worker_loop::Source)s for real queues, each behind a cargo feature that is
//! off by default (its client library is a dependency only when the feature is on):
//!
//! - `redis_streams` (feature `redis-streams`): a Redis stream and its consumer group (Redis 7+).
//! - `rabbitmq` (feature `rabbitmq`): RabbitMQ and other AMQP 0.9.1 brokers, with `lapin`.
//! - `sqs` (feature `sqs`): Amazon SQS and compatible servers, the AWS JSON 1.0 protocol with
//!   Signature V4.

#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
pub mod redis_streams;
#[cfg(feature = "sqs")]
pub mod sqs;
