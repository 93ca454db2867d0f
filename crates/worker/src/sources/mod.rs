//! [`Source`](crate::worker_loop::Source) implementations for real brokers, each behind a cargo
//! feature of its own (off by default):
//!
//! - [`rabbitmq`] (feature `rabbitmq`): RabbitMQ and other AMQP 0.9.1 brokers, with `lapin`.

#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
