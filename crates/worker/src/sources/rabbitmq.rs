//! A [`Source`] over AMQP 0.9.1 (RabbitMQ), with [`lapin`] on tokio.
//!
//! # Permits
//!
//! [`RabbitMqSource::poll`] takes messages with `basic.get`, one at a time, at most `max` (the
//! worker's free permits) per poll, with manual acknowledgement. No consumer is registered
//! (`basic.consume` would have the broker push up to the prefetch count ahead of the permits),
//! and nothing is buffered client-side, so the worker never holds more unacknowledged messages
//! than its permits, and a held worker (0 permits) takes nothing: the backlog stays in the
//! queue, where the operator's queue metrics see it. A poll that finds the queue empty retries
//! every `poll_interval` until `poll_wait` has passed, then returns nothing.
//!
//! # Ack, nack and dead-lettering
//!
//! A processed message is acked (`basic.ack`). A failed one is nacked with `requeue = true`: the
//! broker puts it back and delivers it again. Dead-lettering is the queue's business, through
//! its dead-letter exchange (`x-dead-letter-exchange`, as an argument or a policy):
//!
//! - **quorum queues** (recommended): set `x-delivery-limit` (argument or policy); the broker
//!   counts the deliveries in the `x-delivery-count` header and dead-letters a message nacked
//!   with requeue beyond the limit. [`Source::receive_count`] reads the header, so the
//!   worker loop's redelivery backoff knows the attempt.
//! - **classic queues** count nothing: a message nacked with requeue comes back forever. With
//!   [`RabbitMqSource::dead_letter_after`], the source nacks with `requeue = false` (the broker
//!   routes the message to the queue's DLX, or drops it when the queue has none) once it has
//!   seen the message `n` times, which it knows only from the `x-delivery-count` header (so in
//!   practice on quorum queues) or on a first delivery.
//!
//! AMQP has no delayed requeue: [`Source::nack_after`] is the default (a plain nack; the delay
//! is ignored), so a failed message is back at once. Use the quorum queue's delivery limit to
//! bound the attempts.
//!
//! # Connection loss
//!
//! The source opens one connection and one channel on the first poll. When a `basic.get` fails
//! or the connection is gone, it drops both and opens new ones on the next poll. The messages
//! the worker held unacknowledged on the old channel are not lost: the broker requeues them
//! when the channel dies and delivers them again (`redelivered` set); their own ack or nack
//! then fails with [`RabbitMqError::ChannelGone`] (counted by the loop as a settle error).

use std::time::Duration;

use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

pub use lapin;

use crate::worker_loop::Source;

/// Why a RabbitMQ operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RabbitMqError {
    /// Connecting to the broker or opening a channel failed.
    #[error("connect to the AMQP broker: {0}")]
    Connect(#[source] lapin::Error),
    /// `basic.get` failed (the connection and channel are reopened on the next poll).
    #[error("basic.get from queue {queue:?}: {source}")]
    Get {
        /// The queue.
        queue: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// `basic.ack` failed.
    #[error("basic.ack: {0}")]
    Ack(#[source] lapin::Error),
    /// `basic.nack` failed.
    #[error("basic.nack: {0}")]
    Nack(#[source] lapin::Error),
    /// The channel that delivered the message is closed: the broker has requeued the message and
    /// delivers it again.
    #[error("the channel that delivered the message is closed; the broker redelivers it")]
    ChannelGone,
}

/// A message taken from the queue, unacknowledged until the loop acks or nacks it.
#[derive(Debug)]
pub struct RabbitMqMessage {
    /// The payload.
    pub data: Vec<u8>,
    /// The AMQP properties (headers, message ID, timestamp, ...).
    pub properties: BasicProperties,
    /// The exchange it was published to (empty: the default exchange).
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// The broker delivered it before (to this worker or another).
    pub redelivered: bool,
    /// The broker's count of its earlier deliveries (`x-delivery-count`, quorum queues).
    pub delivery_count: Option<u32>,
    acker: Acker,
}

impl RabbitMqMessage {
    fn from_get(m: BasicGetMessage) -> Self {
        let d = m.delivery;
        let delivery_count = delivery_count(d.properties.headers().as_ref());
        RabbitMqMessage {
            data: d.data,
            exchange: d.exchange.to_string(),
            routing_key: d.routing_key.to_string(),
            redelivered: d.redelivered,
            delivery_count,
            properties: d.properties,
            acker: d.acker,
        }
    }

    /// How many times the broker has delivered it, this delivery included, if known.
    pub fn receive_count(&self) -> Option<u32> {
        receive_count(self.delivery_count, self.redelivered)
    }
}

/// The `x-delivery-count` header: the deliveries before this one (quorum queues set it from
/// the second delivery on).
fn delivery_count(headers: Option<&FieldTable>) -> Option<u32> {
    let v = headers?.inner().get("x-delivery-count")?;
    let n: i128 = match v {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        _ => return None,
    };
    u32::try_from(n).ok()
}

/// This delivery's number (1 on the first): the header's count + 1; 1 for a delivery the
/// broker says is not a redelivery; unknown for a redelivery without the header (classic
/// queues).
fn receive_count(delivery_count: Option<u32>, redelivered: bool) -> Option<u32> {
    match (delivery_count, redelivered) {
        (Some(n), _) => Some(n.saturating_add(1)),
        (None, false) => Some(1),
        (None, true) => None,
    }
}

/// Whether a failed message goes back into the queue (`requeue = true`) rather than to the
/// queue's dead-letter exchange.
fn requeue(receive_count: Option<u32>, dead_letter_after: Option<u32>) -> bool {
    match (receive_count, dead_letter_after) {
        (Some(k), Some(limit)) => k < limit,
        _ => true,
    }
}

struct Session {
    generation: u64,
    connection: Connection,
    channel: Channel,
}

/// A [`Source`] reading one queue with `basic.get`. See the [module docs](self).
pub struct RabbitMqSource {
    uri: String,
    queue: String,
    poll_wait: Duration,
    poll_interval: Duration,
    dead_letter_after: Option<u32>,
    session: Mutex<Option<Session>>,
    generations: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RabbitMqSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URI may carry a password.
        f.debug_struct("RabbitMqSource")
            .field("queue", &self.queue)
            .field("poll_wait", &self.poll_wait)
            .field("poll_interval", &self.poll_interval)
            .field("dead_letter_after", &self.dead_letter_after)
            .finish_non_exhaustive()
    }
}

impl RabbitMqSource {
    /// A source reading `queue` on the broker at `uri` (`amqp://user:password@host:5672/%2f`,
    /// the vhost percent-encoded). Nothing connects before the first poll. Polls wait up to 1 s
    /// for a message, trying every 100 ms.
    pub fn new(uri: impl Into<String>, queue: impl Into<String>) -> Self {
        RabbitMqSource {
            uri: uri.into(),
            queue: queue.into(),
            poll_wait: Duration::from_secs(1),
            poll_interval: Duration::from_millis(100),
            dead_letter_after: None,
            session: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How long a poll waits for a message when the queue is empty.
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    /// How often a waiting poll asks again (at least 1 ms).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Nacks a failed message without requeue (to the queue's dead-letter exchange) once its
    /// known receive count reaches `n` (see the [module docs](self#ack-nack-and-dead-lettering)).
    pub fn dead_letter_after(mut self, n: u32) -> Self {
        self.dead_letter_after = Some(n.max(1));
        self
    }

    /// The queue read.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The open channel (and its generation), connecting first when there is none or the
    /// connection is gone.
    async fn channel(&self) -> Result<(u64, Channel), RabbitMqError> {
        let mut session = self.session.lock().await;
        if let Some(s) = session.as_ref()
            && s.connection.status().connected()
            && s.channel.status().connected()
        {
            return Ok((s.generation, s.channel.clone()));
        }
        if let Some(old) = session.take() {
            close(old).await;
        }
        let connection = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(RabbitMqError::Connect)?;
        let channel = match connection.create_channel().await {
            Ok(c) => c,
            Err(e) => {
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    connection.close(200, "backpressure-worker: no channel".into()),
                )
                .await;
                return Err(RabbitMqError::Connect(e));
            }
        };
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        tracing::debug!(queue = %self.queue, generation, "AMQP channel open");
        *session = Some(Session {
            generation,
            connection,
            channel: channel.clone(),
        });
        Ok((generation, channel))
    }

    /// Drops the session of `generation` (not a newer one), so the next poll reconnects.
    async fn reset(&self, generation: u64) {
        let mut session = self.session.lock().await;
        if session.as_ref().is_some_and(|s| s.generation == generation)
            && let Some(old) = session.take()
        {
            close(old).await;
        }
    }
}

/// Closes a session, best effort and bounded (the connection may be dead already).
async fn close(s: Session) {
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        s.connection
            .close(200, "backpressure-worker reconnects".into()),
    )
    .await;
}

impl Source for RabbitMqSource {
    type Message = RabbitMqMessage;
    type Error = RabbitMqError;

    async fn poll(&self, max: u32) -> Result<Vec<RabbitMqMessage>, RabbitMqError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = tokio::time::Instant::now() + self.poll_wait;
        loop {
            let (generation, channel) = self.channel().await?;
            let mut out = Vec::new();
            while out.len() < max as usize {
                match channel
                    .basic_get(
                        self.queue.as_str().into(),
                        BasicGetOptions { no_ack: false },
                    )
                    .await
                {
                    Ok(Some(m)) => out.push(RabbitMqMessage::from_get(m)),
                    Ok(None) => break,
                    Err(source) => {
                        // The channel is closed (an AMQP error closes it) or the connection
                        // is lost: the broker requeues what this channel delivered, `out`
                        // included.
                        self.reset(generation).await;
                        return Err(RabbitMqError::Get {
                            queue: self.queue.clone(),
                            source,
                        });
                    }
                }
            }
            let now = tokio::time::Instant::now();
            if !out.is_empty() || now >= deadline {
                return Ok(out);
            }
            tokio::time::sleep(self.poll_interval.min(deadline - now)).await;
        }
    }

    async fn ack(&self, message: RabbitMqMessage) -> Result<(), RabbitMqError> {
        match message.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(RabbitMqError::ChannelGone),
            Err(e) => Err(RabbitMqError::Ack(e)),
        }
    }

    async fn nack(&self, message: RabbitMqMessage) -> Result<(), RabbitMqError> {
        let requeue = requeue(message.receive_count(), self.dead_letter_after);
        let options = BasicNackOptions {
            multiple: false,
            requeue,
        };
        match message.acker.nack(options).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(RabbitMqError::ChannelGone),
            Err(e) => Err(RabbitMqError::Nack(e)),
        }
    }

    fn receive_count(&self, message: &RabbitMqMessage) -> Option<u32> {
        message.receive_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: AMQPValue) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert("x-delivery-count".into(), v);
        t
    }

    #[test]
    fn delivery_count_reads_the_integer_types_the_broker_may_send() {
        assert_eq!(delivery_count(None), None);
        assert_eq!(delivery_count(Some(&FieldTable::default())), None);
        assert_eq!(
            delivery_count(Some(&headers(AMQPValue::LongLongInt(3)))),
            Some(3)
        );
        assert_eq!(
            delivery_count(Some(&headers(AMQPValue::LongInt(7)))),
            Some(7)
        );
        assert_eq!(
            delivery_count(Some(&headers(AMQPValue::ShortUInt(2)))),
            Some(2)
        );
        assert_eq!(
            delivery_count(Some(&headers(AMQPValue::LongLongInt(-1)))),
            None
        );
        assert_eq!(
            delivery_count(Some(&headers(AMQPValue::LongString("3".into())))),
            None
        );
    }

    #[test]
    fn receive_count_is_known_from_the_header_or_on_a_first_delivery() {
        assert_eq!(receive_count(None, false), Some(1));
        assert_eq!(receive_count(None, true), None);
        assert_eq!(receive_count(Some(0), false), Some(1));
        assert_eq!(receive_count(Some(4), true), Some(5));
        assert_eq!(receive_count(Some(u32::MAX), true), Some(u32::MAX));
    }

    #[test]
    fn a_failed_message_is_requeued_until_its_known_count_reaches_the_limit() {
        assert!(requeue(Some(1), None));
        assert!(requeue(None, Some(1)));
        assert!(requeue(Some(2), Some(3)));
        assert!(!requeue(Some(3), Some(3)));
        assert!(!requeue(Some(1), Some(1)));
    }
}
