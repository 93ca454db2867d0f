//! The queue: a Redis stream with a consumer group, at-least-once.
//!
//! - [`RedisServer`] runs `redis-server` on a free loopback port with its own directory and no
//!   persistence.
//! - [`Queue`] is one logical queue (a stream, its consumer group, a dead-letter stream and two
//!   counters) with atomic Lua scripts:
//!   - `fetch` first reclaims messages not acknowledged within the visibility timeout
//!     (`XAUTOCLAIM`, with a cursor kept in Redis so the whole pending list is visited), moves a
//!     reclaimed message that has now been delivered more than `max_deliveries` times to the
//!     dead-letter stream, then reads new messages (`XREADGROUP >`);
//!   - `ack` acknowledges and deletes a message and counts a completion once, even when two
//!     workers processed it (at-least-once);
//!   - `nack` hands a failed message to the `~retry` consumer without counting a delivery, so it
//!     is delivered again after the visibility timeout and is not counted as in flight;
//!   - `stats` reads everything the exporter needs in one round trip.
//!
//! The worker library's Redis Streams source (`backpressure_worker::sources::redis_streams`)
//! grew from these scripts. The lab keeps its own queue: its recorder reads the counters under
//! `<prefix>:` (`completed`, `deadcount`) and the conservation check below, one `Queue` serves
//! every consumer, and its workers nack without a receive count, so the library's redelivery
//! backoff does not apply to them; moving the workers to the library source would change what
//! the recorded scenarios measure (redeliveries minutes later instead of after the visibility
//! timeout), which is a decision for the scenarios, not a refactoring.
//!
//! Because acknowledged and dead-lettered messages are deleted from the stream, every message
//! ever produced is in exactly one place: `produced = completed + dead_lettered + in the stream`.
//!
//! # A bounded broker
//!
//! [`Queue::limit_memory`] sets `maxmemory` with the `noeviction` policy: once Redis uses more,
//! it refuses every command that may grow memory with an `OOM` error, as a broker at its memory
//! limit refuses publishers. [`Queue::produce_one`] is such a write ([`QueueError::is_oom`]
//! tells the refusal apart). The consumer side keeps working over the limit, as it does on a
//! broker whose memory alarm blocks only publishers: `fetch`, `ack` and `nack` are scripts
//! flagged `allow-oom` (Redis 7), since what they write (the claim cursor, the completion
//! counter, a message moved to the dead-letter stream) is small or moved, not added, and an
//! ack deletes the message. Without the flag, whether Redis lets such a script write over the
//! limit depends on the order of its commands (a command that may grow memory is refused while
//! the script has written nothing yet), and a refused completion count would stop the queue
//! from draining back under the limit.

use std::path::Path;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Script, Value};

/// Consumer group name.
pub const GROUP: &str = "workers";
/// Consumer that holds failed messages until they are delivered again.
pub const RETRY_CONSUMER: &str = "~retry";

/// A queue error.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis said no.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis answered something unexpected.
    #[error("unexpected redis reply: {0}")]
    Reply(String),
    /// The server could not be started.
    #[error("redis-server: {0}")]
    Server(String),
}

impl QueueError {
    /// True when Redis refused a write because it is at its memory limit (`OOM`).
    pub fn is_oom(&self) -> bool {
        matches!(self, QueueError::Redis(e) if e.code() == Some("OOM"))
    }
}

/// The broker's memory, from `INFO memory`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `used_memory`: bytes allocated by Redis, what `maxmemory` is compared with.
    pub used: u64,
    /// `used_memory_peak`: the highest `used_memory` since the server started.
    pub peak: u64,
    /// `maxmemory` (0: no limit).
    pub max: u64,
}

impl Memory {
    /// Reads the fields of an `INFO memory` answer.
    pub fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Some(Memory {
            used: field("used_memory")?,
            peak: field("used_memory_peak")?,
            max: field("maxmemory").unwrap_or(0),
        })
    }
}

/// A running `redis-server` (the harness in [`backpressure_envtest::redis`], shared with the
/// worker library's Redis Streams tests).
#[derive(Debug)]
pub struct RedisServer(backpressure_envtest::RedisServer);

impl RedisServer {
    /// Starts `redis-server` (from /usr/bin or /usr/local/bin) on a free loopback port, with no
    /// persistence, its files in `dir`; Redis 7.0 or later (the scripts are flagged allow-oom).
    pub fn start(dir: &Path) -> Result<Self, QueueError> {
        Self::start_on(dir, None)
    }

    /// [`RedisServer::start`] listening on `also` as well (a real node's bridge address, where
    /// its pods reach the host).
    pub fn start_on(dir: &Path, also: Option<std::net::Ipv4Addr>) -> Result<Self, QueueError> {
        backpressure_envtest::RedisServer::start_on(dir, also)
            .map(Self)
            .map_err(|e| QueueError::Server(e.to_string()))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// `redis://<host>:<port>/`: the URL for clients that reach it at `host`.
    pub fn url_at(&self, host: std::net::Ipv4Addr) -> String {
        format!("redis://{host}:{}/", self.0.port())
    }

    /// Stops the server.
    pub fn stop(&mut self) {
        self.0.stop();
    }
}

/// One delivered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Stream entry id (`<ms>-<seq>`).
    pub id: String,
    /// How many times it has been delivered, this time included.
    pub deliveries: u64,
    /// The `body` field.
    pub body: String,
}

/// Everything the exporter and the recorder read from the queue at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueStats {
    /// Redis server time in milliseconds.
    pub now_ms: u64,
    /// Messages ever added.
    pub produced: u64,
    /// Messages acknowledged.
    pub completed: u64,
    /// Messages moved to the dead-letter stream.
    pub dead_lettered: u64,
    /// Messages in the stream (never delivered, in flight, or waiting for a retry).
    pub in_stream: u64,
    /// Messages never delivered.
    pub undelivered: u64,
    /// Failed messages waiting to be delivered again.
    pub awaiting_retry: u64,
    /// Age in seconds of the oldest message never delivered (0 when there is none).
    pub oldest_age_secs: f64,
}

impl QueueStats {
    /// Messages waiting: never delivered plus waiting for a retry (not in flight).
    pub fn depth(&self) -> u64 {
        self.undelivered + self.awaiting_retry
    }

    /// True when every message produced is accounted for.
    pub fn conserved(&self) -> bool {
        self.produced == self.completed + self.dead_lettered + self.in_stream
    }
}

/// Milliseconds of a stream id `<ms>-<seq>`.
pub fn id_millis(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

// The queue's scripts live in `crates/lab/lua/`, read by every lab worker (the Rust one here, the
// Go one in `crates/lab/workers/go/` from its `--scripts` directory): one copy of the semantics.
const FETCH: &str = include_str!("../lua/fetch.lua");
const ACK: &str = include_str!("../lua/ack.lua");
const NACK: &str = include_str!("../lua/nack.lua");
const STATS: &str = include_str!("../lua/stats.lua");

/// One logical queue in a Redis server.
#[derive(Clone)]
pub struct Queue {
    conn: MultiplexedConnection,
    prefix: String,
    visibility_timeout: Duration,
    max_deliveries: u32,
    fetch: Script,
    ack: Script,
    nack: Script,
    stats: Script,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("prefix", &self.prefix)
            .field("visibility_timeout", &self.visibility_timeout)
            .field("max_deliveries", &self.max_deliveries)
            .finish()
    }
}

impl Queue {
    /// Connects to the queue named `prefix` (keys `<prefix>:stream`, `<prefix>:dlq`, ...).
    pub async fn connect(
        url: &str,
        prefix: &str,
        visibility_timeout: Duration,
        max_deliveries: u32,
    ) -> Result<Self, QueueError> {
        let client = redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        Ok(Self {
            conn,
            prefix: prefix.to_owned(),
            visibility_timeout,
            max_deliveries,
            fetch: Script::new(FETCH),
            ack: Script::new(ACK),
            nack: Script::new(NACK),
            stats: Script::new(STATS),
        })
    }

    fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.prefix)
    }

    /// The stream key.
    pub fn stream_key(&self) -> String {
        self.key("stream")
    }

    /// The dead-letter stream key.
    pub fn dlq_key(&self) -> String {
        self.key("dlq")
    }

    /// Creates the stream and the consumer group (idempotent).
    pub async fn create(&self) -> Result<(), QueueError> {
        let mut c = self.conn.clone();
        let r: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.stream_key())
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.to_string().contains("BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Adds `bodies` to the stream.
    pub async fn produce(&self, bodies: &[String]) -> Result<(), QueueError> {
        if bodies.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for b in bodies {
            pipe.cmd("XADD")
                .arg(self.stream_key())
                .arg("*")
                .arg("body")
                .arg(b)
                .ignore();
        }
        let mut c = self.conn.clone();
        pipe.query_async::<()>(&mut c).await?;
        Ok(())
    }

    /// Adds one message; a Redis at its memory limit refuses it ([`QueueError::is_oom`]) and
    /// nothing is added.
    pub async fn produce_one(&self, body: &str) -> Result<(), QueueError> {
        let mut c = self.conn.clone();
        let _: Value = redis::cmd("XADD")
            .arg(self.stream_key())
            .arg("*")
            .arg("body")
            .arg(body)
            .query_async(&mut c)
            .await?;
        Ok(())
    }

    /// Bounds the whole Redis server this queue lives in: `maxmemory` `bytes` with the
    /// `noeviction` policy (see the module docs).
    pub async fn limit_memory(&self, bytes: u64) -> Result<(), QueueError> {
        let mut c = self.conn.clone();
        for (key, value) in [
            ("maxmemory-policy", "noeviction".to_owned()),
            ("maxmemory", bytes.to_string()),
        ] {
            let _: Value = redis::cmd("CONFIG")
                .arg("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut c)
                .await?;
        }
        Ok(())
    }

    /// The server's memory use (`INFO memory`).
    pub async fn memory(&self) -> Result<Memory, QueueError> {
        let mut c = self.conn.clone();
        let info: String = redis::cmd("INFO").arg("memory").query_async(&mut c).await?;
        Memory::parse(&info)
            .ok_or_else(|| QueueError::Reply("INFO memory without used_memory".into()))
    }

    /// Delivers up to `max` messages to `consumer`: reclaimed ones first, then new ones.
    pub async fn fetch(&self, consumer: &str, max: usize) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut c = self.conn.clone();
        let v: Value = self
            .fetch
            .key(self.stream_key())
            .key(self.dlq_key())
            .key(self.key("deadcount"))
            .key(self.key("cursor"))
            .arg(GROUP)
            .arg(consumer)
            .arg(max)
            .arg(self.visibility_timeout.as_millis() as u64)
            .arg(self.max_deliveries)
            .invoke_async(&mut c)
            .await?;
        parse_deliveries(v)
    }

    /// Acknowledges a processed message; true when this call completed it (false when another
    /// delivery of the same message already did, or it was dead-lettered meanwhile).
    pub async fn ack(&self, id: &str) -> Result<bool, QueueError> {
        let mut c = self.conn.clone();
        let n: i64 = self
            .ack
            .key(self.stream_key())
            .key(self.key("completed"))
            .arg(GROUP)
            .arg(id)
            .invoke_async(&mut c)
            .await?;
        Ok(n == 1)
    }

    /// Gives a failed message back: it is delivered again after the visibility timeout.
    pub async fn nack(&self, id: &str) -> Result<(), QueueError> {
        let mut c = self.conn.clone();
        let _: i64 = self
            .nack
            .key(self.stream_key())
            .arg(GROUP)
            .arg(RETRY_CONSUMER)
            .arg(id)
            .invoke_async(&mut c)
            .await?;
        Ok(())
    }

    /// Reads the queue's counters and gauges.
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let mut c = self.conn.clone();
        let v: Vec<Value> = self
            .stats
            .key(self.stream_key())
            .key(self.key("completed"))
            .key(self.key("deadcount"))
            .arg(GROUP)
            .arg(RETRY_CONSUMER)
            .invoke_async(&mut c)
            .await?;
        let int = |i: usize| -> Result<u64, QueueError> {
            match v.get(i) {
                Some(Value::Int(n)) => Ok((*n).max(0) as u64),
                other => Err(QueueError::Reply(format!("stats[{i}] = {other:?}"))),
            }
        };
        let now_ms = int(0)?;
        let oldest = match v.get(5) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        let in_stream = int(2)?;
        let pending = int(3)?;
        let oldest_age_secs = id_millis(&oldest)
            .map(|ms| now_ms.saturating_sub(ms) as f64 / 1000.0)
            .unwrap_or(0.0);
        Ok(QueueStats {
            now_ms,
            produced: int(1)?,
            in_stream,
            undelivered: in_stream.saturating_sub(pending),
            awaiting_retry: int(4)?,
            oldest_age_secs,
            completed: int(6)?,
            dead_lettered: int(7)?,
        })
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn parse_deliveries(v: Value) -> Result<Vec<Delivery>, QueueError> {
    let Value::Array(items) = v else {
        return Err(QueueError::Reply(format!("fetch: {v:?}")));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(parts) = item else {
            return Err(QueueError::Reply("fetch: entry is not an array".into()));
        };
        let id = parts.first().and_then(text).unwrap_or_default();
        let deliveries = match parts.get(1) {
            Some(Value::Int(n)) => (*n).max(1) as u64,
            _ => 1,
        };
        let mut body = String::new();
        if let Some(Value::Array(fields)) = parts.get(2) {
            for pair in fields.chunks(2) {
                if pair.len() == 2 && text(&pair[0]).as_deref() == Some("body") {
                    body = text(&pair[1]).unwrap_or_default();
                }
            }
        }
        if id.is_empty() {
            return Err(QueueError::Reply("fetch: entry without id".into()));
        }
        out.push(Delivery {
            id,
            deliveries,
            body,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn stream_id_millis() {
        assert_eq!(id_millis("1700000000123-4"), Some(1_700_000_000_123));
        assert_eq!(id_millis(""), None);
    }

    #[test]
    fn depth_and_conservation() {
        let s = QueueStats {
            produced: 10,
            completed: 5,
            dead_lettered: 1,
            in_stream: 4,
            undelivered: 2,
            awaiting_retry: 1,
            ..QueueStats::default()
        };
        assert_eq!(s.depth(), 3);
        assert!(s.conserved());
        assert!(!QueueStats { completed: 6, ..s }.conserved());
    }

    #[test]
    fn memory_from_info() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_peak:2097152\r\nmaxmemory:4194304\r\nmaxmemory_human:4.00M\r\n";
        assert_eq!(
            Memory::parse(info),
            Some(Memory {
                used: 1_048_576,
                peak: 2_097_152,
                max: 4_194_304
            })
        );
        assert_eq!(Memory::parse("# Memory\r\n"), None);
    }

    /// Against a real redis-server with `maxmemory`: a write beyond it is refused with OOM
    /// and adds nothing; the consumer side (fetch, nack, ack, dead-lettering) keeps working
    /// over the limit, and acks bring the memory back under it so writes succeed again.
    #[tokio::test]
    async fn real_redis_semantics_memory_limit_refuses_writes_not_consumers() {
        let dir = std::env::temp_dir().join(format!("bp-lab-oom-{}", std::process::id()));
        let mut server = RedisServer::start(&dir).unwrap();
        let q = Queue::connect(&server.url(), "m", Duration::from_millis(100), 1)
            .await
            .unwrap();
        q.create().await.unwrap();
        let base = q.memory().await.unwrap();
        assert!(base.used > 0 && base.max == 0, "{base:?}");
        let limit = base.used + 600_000;
        q.limit_memory(limit).await.unwrap();
        assert_eq!(q.memory().await.unwrap().max, limit);
        let body = "x".repeat(8000);
        let mut written = 0u64;
        let refusal = loop {
            match q.produce_one(&body).await {
                Ok(()) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 1000, "never refused");
        };
        assert!(refusal.is_oom(), "{refusal}");
        assert!(written >= 50, "{written}");
        let s = q.stats().await.unwrap();
        assert_eq!(s.produced, written, "a refused write adds nothing");
        let m = q.memory().await.unwrap();
        assert!(m.used >= limit && m.peak >= m.used, "{m:?}");

        // Over the limit: fetch, nack, and (after the visibility timeout, one delivery
        // allowed) dead-lettering, then acks.
        let got = q.fetch("a", 2).await.unwrap();
        assert_eq!(got.len(), 2);
        for d in &got {
            q.nack(&d.id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        let next = q.fetch("a", 1000).await.unwrap();
        assert_eq!(q.stats().await.unwrap().dead_lettered, 2);
        assert_eq!(next.len() as u64, written - 2);
        for d in &next {
            assert!(q.ack(&d.id).await.unwrap());
        }
        let s = q.stats().await.unwrap();
        assert_eq!((s.completed, s.dead_lettered), (written - 2, 2));
        assert!(s.conserved(), "{s:?}");
        q.produce_one(&body).await.unwrap();
        server.stop();
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Against a real redis-server: at-least-once, redelivery after the visibility timeout,
    /// dead-lettering after `max_deliveries`, the age of the oldest undelivered message, and
    /// conservation.
    #[tokio::test]
    async fn real_redis_semantics() {
        let dir = std::env::temp_dir().join(format!("bp-lab-queue-{}", std::process::id()));
        let mut server = RedisServer::start(&dir).unwrap();
        let q = Queue::connect(&server.url(), "t", Duration::from_millis(300), 2)
            .await
            .unwrap();
        q.create().await.unwrap();
        q.create().await.unwrap();
        q.produce(&(0..5).map(|i| format!("m{i}")).collect::<Vec<_>>())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = q.stats().await.unwrap();
        assert_eq!((s.produced, s.undelivered, s.depth()), (5, 5, 5));
        assert!(s.oldest_age_secs >= 0.04, "{s:?}");

        let got = q.fetch("a", 2).await.unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].body, "m0");
        assert_eq!(got[0].deliveries, 1);
        assert!(q.ack(&got[0].id).await.unwrap());
        assert!(
            !q.ack(&got[0].id).await.unwrap(),
            "a second ack counts nothing"
        );
        q.nack(&got[1].id).await.unwrap();
        let s = q.stats().await.unwrap();
        assert_eq!(
            (s.completed, s.undelivered, s.awaiting_retry, s.in_stream),
            (1, 3, 1, 4)
        );
        assert!(s.conserved());

        // Not visible again before the timeout: the next fetch gets new messages.
        let next = q.fetch("b", 1).await.unwrap();
        assert_eq!(next[0].body, "m2");
        q.nack(&next[0].id).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let again = q.fetch("b", 2).await.unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!((again[0].body.as_str(), again[0].deliveries), ("m1", 2));
        assert_eq!((again[1].body.as_str(), again[1].deliveries), ("m2", 2));
        for d in &again {
            q.nack(&d.id).await.unwrap();
        }
        // Third delivery exceeds max_deliveries = 2: both go to the dead-letter stream.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let third = q.fetch("c", 2).await.unwrap();
        assert!(
            third.iter().all(|d| d.body != "m1" && d.body != "m2"),
            "{third:?}"
        );
        let s = q.stats().await.unwrap();
        assert_eq!(s.dead_lettered, 2);
        assert!(s.conserved(), "{s:?}");
        let mut c = q.conn.clone();
        let dlq_len: u64 = redis::cmd("XLEN")
            .arg(q.dlq_key())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(dlq_len, 2);
        server.stop();
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Issue 17, item 4: `fetch(max)` hands a consumer at most `max` messages, reclaimed and new
    /// together (`XAUTOCLAIM COUNT` then `XREADGROUP COUNT` of what is left), so a worker that
    /// asks for its free permits holds no more than its permits. The name keeps it with the
    /// other real-Redis test (skipped by `make unit`).
    #[tokio::test]
    async fn real_redis_semantics_fetch_never_hands_out_more_than_asked() {
        let dir = std::env::temp_dir().join(format!("bp-lab-fetch-{}", std::process::id()));
        let mut server = RedisServer::start(&dir).unwrap();
        let q = Queue::connect(&server.url(), "f", Duration::from_millis(200), 5)
            .await
            .unwrap();
        q.create().await.unwrap();
        q.produce(&(0..20).map(|i| format!("m{i}")).collect::<Vec<_>>())
            .await
            .unwrap();
        let pending = |consumer: &'static str| {
            let q = q.clone();
            async move {
                let mut c = q.conn.clone();
                let v: Vec<Value> = redis::cmd("XPENDING")
                    .arg(q.stream_key())
                    .arg(GROUP)
                    .arg("-")
                    .arg("+")
                    .arg(100)
                    .arg(consumer)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                v.len()
            }
        };
        let first = q.fetch("a", 3).await.unwrap();
        assert_eq!(first.len(), 3);
        assert_eq!(pending("a").await, 3);
        for d in &first {
            q.nack(&d.id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Three are due for redelivery; asking for two gets two, not three.
        let two = q.fetch("b", 2).await.unwrap();
        assert_eq!(two.len(), 2, "{two:?}");
        assert_eq!(pending("b").await, 2);
        // One reclaimed and four new: five, as asked.
        let five = q.fetch("b", 5).await.unwrap();
        assert_eq!(five.len(), 5, "{five:?}");
        assert_eq!(five.iter().filter(|d| d.deliveries == 2).count(), 1);
        assert_eq!(pending("b").await, 7);
        assert!(q.fetch("b", 0).await.unwrap().is_empty());
        assert_eq!(pending("b").await, 7);
        let s = q.stats().await.unwrap();
        assert_eq!(s.undelivered, 13, "{s:?}");
        server.stop();
        let _ = std::fs::remove_dir_all(dir);
    }
}
