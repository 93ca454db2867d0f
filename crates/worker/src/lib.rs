//! Worker-side backpressure for queue workers.
//!
//! A queue worker records the outcome of every message; a pluggable [`controller`] turns the
//! outcomes into a *backoff factor* in `[0, 1]` against a *set point* (the dependency-failure
//! fraction treated as background noise) and into a number of *permits*: how many messages the
//! worker may process at once. When the dependency fails more than the set point, the worker
//! slows down and the work waits in the queue instead of hammering the dependency and filling the
//! dead-letter queue; fully backed off, it probes one message at a time and slow-starts back up
//! when the dependency recovers.
//!
//! This crate is the in-pod half of `backpressure-operator` (its wire contract is in
//! [`backpressure_api::wire`]), and works on its own:
//!
//! - [`controller`]: the [`Controller`](controller::Controller) trait and the `SetPoint`
//!   (default), `RatioThrottle`, `Fixed` and `Off` controllers. Plain synchronous state with time
//!   passed in, so simulations drive them deterministically;
//! - [`permits`]: the async [`Gate`](permits::Gate) passed before each poll;
//! - [`metrics`]: Prometheus metrics with the wire contract's names;
//! - [`config`]: applies a `WorkerConfig` at runtime from a watched file and from authenticated
//!   pushes to the admin port (TokenReview, cargo feature `kube`, on by default);
//! - [`worker_loop`]: a poll/process/ack loop over a [`Source`](worker_loop::Source) and a
//!   [`Handler`](worker_loop::Handler);
//! - [`sources`]: sources for real brokers, each behind a cargo feature (off by default):
//!   RabbitMQ (`rabbitmq`);
//! - [`producer`]: the other end of the queue, the [`ProducerGate`](producer::ProducerGate) a
//!   producer passes before every send, so the operator can pause or throttle it while the
//!   queue is above its high watermark (pushed to the same admin server, or read from a file).
//! - [`sources`]: [`Source`](worker_loop::Source)s for real queues, each behind a cargo feature
//!   off by default (`redis-streams`: a Redis stream and consumer group).
//!
//! How to choose the set point and the reaction size (and size the DLQ):
//! `docs/choosing-s-and-n.md` in this crate.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use backpressure_api::wire::WorkerConfig;
//! use backpressure_worker::config::{ConfigState, admin::Admin};
//! use backpressure_worker::controller::{self, Outcome};
//! use backpressure_worker::metrics::Metrics;
//! use backpressure_worker::permits::Gate;
//! use backpressure_worker::worker_loop::{Delivery, Handler, MemorySource, WorkerLoop};
//!
//! /// Calls the dependency and classifies the result.
//! struct Export;
//!
//! impl Handler<Delivery<String>> for Export {
//!     async fn handle(&self, message: &Delivery<String>) -> Outcome {
//!         if message.body.is_empty() {
//!             Outcome::MessageFailure // bad input: never drives backoff
//!         } else {
//!             Outcome::Success // a timeout or a 503 would be Outcome::DependencyFailure
//!         }
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let metrics = Metrics::new("export-worker");
//! let gate = Gate::builder(controller::from_config(&WorkerConfig::default(), 42))
//!     .metrics(metrics.clone())
//!     .build();
//! // Runtime configuration: serve the admin port (metrics, health, config).
//! let state = ConfigState::new(gate.clone(), WorkerConfig::default(), Some(metrics.clone()));
//! let admin = Arc::new(Admin::new(state, Some(metrics.clone())));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! tokio::spawn(admin.serve(listener, std::future::pending()));
//!
//! let queue = Arc::new(MemorySource::new(5, Duration::from_millis(10)));
//! for i in 0..100 {
//!     queue.push(format!("design-{i}"));
//! }
//! let worker = WorkerLoop::new(queue.clone(), Arc::new(Export), gate.clone());
//! let stats = worker.run(tokio::time::sleep(Duration::from_millis(200))).await;
//! assert_eq!(queue.acked(), 100);
//! assert_eq!(stats.outcomes[Outcome::Success.index()], 100);
//! assert_eq!(gate.snapshot().backoff, 0.0);
//! # });
//! ```

pub mod config;
pub mod conformance;
pub mod controller;
pub mod metrics;
pub mod permits;
pub mod producer;
pub mod sources;
pub mod worker_loop;
