//! A [`Source`] for a Redis stream read through a consumer group (cargo feature
//! `redis-streams`; Redis 7.0 or later).
//!
//! Each worker pod is one consumer of the group. Every operation that touches more than one
//! command is one Lua script, so it is atomic in Redis (the scripts come from the lab's queue,
//! `crates/lab/src/queue.rs`, where they run under load):
//!
//! - **poll(max)** first reclaims pending messages idle longer than the visibility timeout
//!   (`XAUTOCLAIM`, with a cursor kept in Redis so the whole pending list is visited over
//!   successive polls): messages of a consumer that died, and failed messages whose redelivery
//!   delay has passed. A reclaimed message whose delivery count now exceeds `max_deliveries` is
//!   moved to the dead-letter stream instead (`<stream>:dlq` unless configured; the entry keeps
//!   its fields and gains `source_id` and `deliveries`). Then it reads new messages
//!   (`XREADGROUP ... COUNT n >`) for what is left of `max`: a poll never hands out more than
//!   `max` messages and nothing is buffered in the worker, so a worker holds no more unacknowledged
//!   messages than its permits and a held worker fetches nothing. When the script finds nothing,
//!   the poll waits up to [`RedisStreamsConfig::block`] for new messages (`XREADGROUP BLOCK`, on
//!   a connection of its own so acks are not queued behind it).
//! - **ack** is `XACK`; the first ack of a message counts one completion (at-least-once: a
//!   message reclaimed from a slow consumer may be processed twice, but is counted once). With
//!   [`RedisStreamsConfig::delete_on_ack`] the entry is also deleted (`XDEL`), which bounds the
//!   stream without trimming; off by default, because deleted entries between a group's position
//!   and the stream's end stop Redis from computing the group's `lag` (`docs/queues.md`): trim the
//!   stream yourself then (`XADD ... MAXLEN ~ n` or `XTRIM MINID`).
//! - **nack** hands the message to the consumer `~retry` (`XCLAIM ... JUSTID`, which does not
//!   count a delivery): it stays in the group's pending list, is not in flight for any worker,
//!   and is reclaimed by the next poll after the visibility timeout. A message that failed its
//!   `max_deliveries`-th delivery is dead-lettered at once instead, and a message another
//!   consumer has reclaimed meanwhile (this one was slower than the visibility timeout) is left
//!   to that consumer.
//! - **nack_after(delay)** does the same with the message's idle time set so that it becomes
//!   reclaimable `delay` from now (`XCLAIM ... IDLE timeout-delay`). A delay longer than the
//!   visibility timeout is also recorded in a sorted set (`<prefix>:<group>:retry-due`); a poll
//!   that reclaims such a message before it is due gives it back to `~retry` with its delivery
//!   count restored (`XCLAIM ... RETRYCOUNT`) and its idle time set to come back when due.
//! - **receive_count** is the delivery count of the message's pending entry (1 on the first
//!   delivery), so [`WorkerLoop`](crate::worker_loop::WorkerLoop)'s redelivery backoff applies.
//!
//! Keys besides the stream (all under `<prefix>` = the stream name unless
//! [`RedisStreamsConfig::state_prefix`] is set, so a hash tag in the stream name, `{orders}`,
//! keeps them in its Redis Cluster slot): `<prefix>:<group>:cursor`, `<prefix>:<group>:retry-due`,
//! `<prefix>:<group>:completed` and `<prefix>:<group>:dead-letters` (counters for
//! [`RedisStreamsSource::stats`]).
//!
//! # Queue metrics
//!
//! [`RedisStreamsSource::stats`] reads the queue in one round trip and
//! [`StreamStats::exposition`] renders the wire contract's `backpressure_queue_*` series
//! (`docs/wire-contract.md`). Export them from **one** process per queue (an exporter
//! Deployment of one replica, or one elected pod), not from every worker: the operator sums the
//! depth and the rates over the series it finds. The standard alternative is redis_exporter with
//! the `RedisStreams` preset (`docs/queues.md`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use backpressure_worker::controller::{self, Outcome};
//! use backpressure_worker::permits::Gate;
//! use backpressure_worker::sources::redis_streams::{
//!     RedisStreamsConfig, RedisStreamsSource, StreamMessage,
//! };
//! use backpressure_worker::worker_loop::{Handler, WorkerLoop};
//!
//! struct Export;
//!
//! impl Handler<StreamMessage> for Export {
//!     async fn handle(&self, message: &StreamMessage) -> Outcome {
//!         match message.field_str("body") {
//!             Some(_) => Outcome::Success,
//!             None => Outcome::MessageFailure,
//!         }
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pod = std::env::var("HOSTNAME")?;
//! let config = RedisStreamsConfig::new("orders", "export-workers", pod)
//!     .visibility_timeout(Duration::from_secs(60))
//!     .max_deliveries(5);
//! let source = RedisStreamsSource::connect("redis://orders-redis:6379/", config).await?;
//! source.ensure_group("0").await?;
//! let gate = Gate::new(controller::build(controller::Settings::default(), 42));
//! let worker = WorkerLoop::new(Arc::new(source), Arc::new(Export), gate);
//! worker.run(async { let _ = tokio::signal::ctrl_c().await; }).await;
//! # Ok(()) }
//! ```

use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::wire::metrics as m;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, Value};
use tokio::sync::Mutex;

use crate::worker_loop::Source;

/// The consumer that holds failed messages until they are reclaimed.
pub const RETRY_CONSUMER: &str = "~retry";

/// A Redis Streams source error.
#[derive(Debug, thiserror::Error)]
pub enum RedisStreamsError {
    /// Redis refused or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// Redis answered something this source does not understand.
    #[error("unexpected redis reply: {0}")]
    Reply(String),
    /// The configuration is unusable.
    #[error("invalid redis streams configuration: {0}")]
    Config(String),
}

/// Where and how to consume. Built with [`RedisStreamsConfig::new`] and the setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisStreamsConfig {
    stream: String,
    group: String,
    consumer: String,
    dead_letter_stream: Option<String>,
    state_prefix: Option<String>,
    visibility_timeout: Duration,
    max_deliveries: u32,
    block: Duration,
    delete_on_ack: bool,
}

impl RedisStreamsConfig {
    /// Consumes `stream` as `consumer` (unique per worker pod, e.g. the pod name) of `group`,
    /// with a visibility timeout of 30 s, 5 deliveries before dead-lettering, polls that wait up
    /// to 1 s for new messages, and acked entries kept in the stream.
    pub fn new(
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        Self {
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
            dead_letter_stream: None,
            state_prefix: None,
            visibility_timeout: Duration::from_secs(30),
            max_deliveries: 5,
            block: Duration::from_secs(1),
            delete_on_ack: false,
        }
    }

    /// How long a delivered message may stay unacknowledged before another consumer reclaims it
    /// (at least 1 ms). Longer than the processing time of a message.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Deliveries after which a message goes to the dead-letter stream instead (at least 1).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// The dead-letter stream (default `<stream>:dlq`).
    pub fn dead_letter_stream(mut self, key: impl Into<String>) -> Self {
        self.dead_letter_stream = Some(key.into());
        self
    }

    /// The prefix of the source's own keys (default: the stream name).
    pub fn state_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.state_prefix = Some(prefix.into());
        self
    }

    /// How long a poll that finds nothing waits for new messages (`XREADGROUP BLOCK`; zero:
    /// return at once, and the loop polls again at once).
    pub fn block(mut self, wait: Duration) -> Self {
        self.block = wait;
        self
    }

    /// Deletes acknowledged and dead-lettered entries from the stream (`XDEL`); see the
    /// [module docs](self).
    pub fn delete_on_ack(mut self, delete: bool) -> Self {
        self.delete_on_ack = delete;
        self
    }

    /// The stream key.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This consumer.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The dead-letter stream key.
    pub fn dead_letter_key(&self) -> String {
        self.dead_letter_stream
            .clone()
            .unwrap_or_else(|| format!("{}:dlq", self.stream))
    }

    /// The key of one piece of the source's state: `<prefix>:<group>:<what>`.
    fn state_key(&self, what: &str) -> String {
        let prefix = self.state_prefix.as_deref().unwrap_or(&self.stream);
        format!("{prefix}:{}:{what}", self.group)
    }

    fn validate(&self) -> Result<(), RedisStreamsError> {
        if self.stream.is_empty() || self.group.is_empty() || self.consumer.is_empty() {
            return Err(RedisStreamsError::Config(
                "stream, group and consumer must not be empty".into(),
            ));
        }
        if self.consumer == RETRY_CONSUMER {
            return Err(RedisStreamsError::Config(format!(
                "{RETRY_CONSUMER} is the consumer that holds failed messages"
            )));
        }
        if self.dead_letter_key() == self.stream {
            return Err(RedisStreamsError::Config(
                "the dead-letter stream must differ from the stream".into(),
            ));
        }
        Ok(())
    }
}

/// How a failed message is handed back: its idle time in the pending list, and (for delays
/// beyond the visibility timeout) how long from now it is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NackPlan {
    /// `XCLAIM ... IDLE`: reclaimable after `visibility_timeout - idle`.
    idle_ms: u64,
    /// Recorded in the retry-due set when non-zero.
    due_in_ms: u64,
}

fn nack_plan(delay: Duration, visibility_timeout: Duration) -> NackPlan {
    let vt = millis(visibility_timeout).max(1);
    let d = millis(delay);
    if d <= vt {
        NackPlan {
            idle_ms: vt - d,
            due_in_ms: 0,
        }
    } else {
        NackPlan {
            idle_ms: 0,
            due_in_ms: d,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What [`RedisStreamsSource::nack_id`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nacked {
    /// Handed to [`RETRY_CONSUMER`], to be reclaimed after the delay.
    Retry,
    /// That was its `max_deliveries`-th delivery: moved to the dead-letter stream.
    DeadLettered,
    /// Not pending at this consumer any more: acknowledged, dead-lettered, or reclaimed by
    /// another consumer after the visibility timeout (left to that one).
    NotHeld,
}

/// One delivered stream entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMessage {
    /// The entry id (`<ms>-<seq>`).
    pub id: String,
    /// Deliveries so far, this one included (1 on the first).
    pub deliveries: u32,
    /// The entry's fields, in order.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl StreamMessage {
    /// The value of the first field named `name`.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The value of the first field named `name`, if it is UTF-8.
    pub fn field_str(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// The queue at one moment, as [`RedisStreamsSource::stats`] reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    /// Redis server time, milliseconds since the epoch.
    pub now_ms: u64,
    /// Entries ever added to the stream (`entries-added`).
    pub arrivals: u64,
    /// Messages acknowledged by this group (each counted once).
    pub completions: u64,
    /// Messages this group moved to the dead-letter stream.
    pub dead_letters: u64,
    /// Entries in the stream (`XLEN`).
    pub in_stream: u64,
    /// Entries in the group's pending list (in flight, or failed and waiting for a retry).
    pub pending: u64,
    /// Failed messages waiting for a retry (pending under [`RETRY_CONSUMER`]).
    pub awaiting_retry: u64,
    /// Entries never delivered to the group: the group's `lag`, or, when Redis cannot compute
    /// it, `in_stream - pending` (exact only when acked entries are deleted).
    pub undelivered: u64,
    /// Age in seconds of the oldest entry never delivered (0 when none waits).
    pub oldest_age_secs: f64,
}

impl StreamStats {
    /// Messages waiting: never delivered, plus failed ones waiting for a retry.
    pub fn depth(&self) -> u64 {
        self.undelivered + self.awaiting_retry
    }

    /// The wire contract's queue series (`backpressure_queue_*`, `docs/wire-contract.md`) in
    /// the Prometheus text format, labelled `namespace` and `workload`.
    pub fn exposition(&self, namespace: &str, workload: &str) -> String {
        let labels = format!(
            "{}=\"{}\",{}=\"{}\"",
            m::LABEL_NAMESPACE,
            escape_label(namespace),
            m::LABEL_WORKLOAD,
            escape_label(workload)
        );
        let series: [(&str, &str, &str, f64); 5] = [
            (
                m::QUEUE_AGE,
                "gauge",
                "Age of the oldest message never delivered.",
                self.oldest_age_secs,
            ),
            (
                m::QUEUE_DEPTH,
                "gauge",
                "Messages waiting (never delivered, or failed and waiting for a retry).",
                self.depth() as f64,
            ),
            (
                m::QUEUE_ARRIVALS_TOTAL,
                "counter",
                "Messages that arrived.",
                self.arrivals as f64,
            ),
            (
                m::QUEUE_COMPLETIONS_TOTAL,
                "counter",
                "Messages acknowledged.",
                self.completions as f64,
            ),
            (
                m::QUEUE_DEAD_LETTERS_TOTAL,
                "counter",
                "Messages moved to the dead-letter stream.",
                self.dead_letters as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
        out
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Milliseconds of a stream id `<ms>-<seq>`.
fn id_millis(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

const FETCH: &str = r#"#!lua flags=allow-oom
local stream, dlq, dead_count, cursor_key, due_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer, retry = ARGV[1], ARGV[2], ARGV[3]
local want = tonumber(ARGV[4])
local vt, max_deliveries, delete = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local cursor = redis.call('GET', cursor_key) or '0-0'
local claimed = redis.call('XAUTOCLAIM', stream, group, consumer, vt, cursor, 'COUNT', want)
redis.call('SET', cursor_key, claimed[1])
for _, e in ipairs(claimed[2]) do
  local id = e[1]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local deliveries = 1
  if p[1] then deliveries = p[1][4] end
  local due = tonumber(redis.call('ZSCORE', due_key, id) or '0')
  if due > now then
    local wait = math.min(due - now, vt)
    redis.call('XCLAIM', stream, group, retry, 0, id, 'IDLE', vt - wait,
      'RETRYCOUNT', math.max(deliveries - 1, 0), 'JUSTID')
  else
    if due > 0 then redis.call('ZREM', due_key, id) end
    if deliveries > max_deliveries then
      redis.call('XADD', dlq, '*', 'source_id', id, 'deliveries', deliveries - 1, unpack(e[2] or {}))
      redis.call('XACK', stream, group, id)
      if delete then redis.call('XDEL', stream, id) end
      redis.call('INCR', dead_count)
    else
      table.insert(out, {id, deliveries, e[2]})
    end
  end
end
local left = want - #out
if left > 0 then
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', left, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do table.insert(out, {e[1], 1, e[2]}) end
  end
end
return out
"#;

const ACK: &str = r#"#!lua flags=allow-oom
local stream, completed, due_key = KEYS[1], KEYS[2], KEYS[3]
local group, id = ARGV[1], ARGV[2]
local n = redis.call('XACK', stream, group, id)
if n == 1 then
  if ARGV[3] == '1' then redis.call('XDEL', stream, id) end
  redis.call('INCR', completed)
  redis.call('ZREM', due_key, id)
end
return n
"#;

const NACK: &str = r#"#!lua flags=allow-oom
local stream, due_key, dlq, dead_count = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, retry, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local idle, due_in = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_deliveries, delete = tonumber(ARGV[7]), ARGV[8] == '1'
local p = redis.call('XPENDING', stream, group, id, id, 1)
if not p[1] or p[1][2] ~= consumer then return 0 end
local deliveries = p[1][4]
if deliveries >= max_deliveries then
  local e = redis.call('XRANGE', stream, id, id)
  local fields = {}
  if e[1] then fields = e[1][2] end
  redis.call('XADD', dlq, '*', 'source_id', id, 'deliveries', deliveries, unpack(fields))
  redis.call('XACK', stream, group, id)
  if delete then redis.call('XDEL', stream, id) end
  redis.call('INCR', dead_count)
  redis.call('ZREM', due_key, id)
  return 2
end
redis.call('XCLAIM', stream, group, retry, 0, id, 'IDLE', idle, 'JUSTID')
if due_in > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', due_key, now + due_in, id)
end
return 1
"#;

const STATS: &str = r#"
local stream, completed, dead_count = KEYS[1], KEYS[2], KEYS[3]
local group, retry = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local info = redis.call('XINFO', 'STREAM', stream)
local added, xlen = 0, 0
for i = 1, #info, 2 do
  if info[i] == 'entries-added' then added = info[i + 1] end
  if info[i] == 'length' then xlen = info[i + 1] end
end
local last, lag = '0-0', -1
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, ldi, glag = nil, nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then ldi = g[i + 1] end
    if g[i] == 'lag' then glag = g[i + 1] end
  end
  if name == group then
    last = ldi
    if glag then lag = glag end
  end
end
local summary = redis.call('XPENDING', stream, group)
local pending = summary[1]
local retrying = 0
if summary[4] then
  for _, c in ipairs(summary[4]) do
    if c[1] == retry then retrying = tonumber(c[2]) end
  end
end
local oldest = ''
local first = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)
if first[1] then oldest = first[1][1] end
return {now_ms, added, xlen, pending, retrying, oldest,
        tonumber(redis.call('GET', completed) or '0'), tonumber(redis.call('GET', dead_count) or '0'),
        lag}
"#;

/// A connection made on first use and made again after it failed.
struct Lazy {
    client: redis::Client,
    config: AsyncConnectionConfig,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl Lazy {
    async fn get(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Forgets the connection after an error that may have broken it.
    async fn failed(&self, e: &RedisError) {
        if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
            tracing::debug!(error = %e, "redis streams: reconnecting");
            *self.conn.lock().await = None;
        }
    }
}

/// A stream and consumer group as a [`Source`]. See the [module docs](self).
pub struct RedisStreamsSource {
    config: RedisStreamsConfig,
    conn: Lazy,
    /// For `XREADGROUP BLOCK` only, with a response timeout longer than the block.
    blocking: Lazy,
    fetch: Script,
    ack: Script,
    nack: Script,
    stats: Script,
}

impl fmt::Debug for RedisStreamsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisStreamsSource {
    /// Connects to the Redis at `url` (`redis://host:port/db`).
    pub async fn connect(url: &str, config: RedisStreamsConfig) -> Result<Self, RedisStreamsError> {
        config.validate()?;
        let client = redis::Client::open(url)?;
        let blocking_config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(config.block + Duration::from_secs(5)));
        let source = Self {
            conn: Lazy {
                client: client.clone(),
                config: AsyncConnectionConfig::new(),
                conn: Mutex::new(None),
            },
            blocking: Lazy {
                client,
                config: blocking_config,
                conn: Mutex::new(None),
            },
            config,
            fetch: Script::new(FETCH),
            ack: Script::new(ACK),
            nack: Script::new(NACK),
            stats: Script::new(STATS),
        };
        source.conn.get().await?;
        Ok(source)
    }

    /// The configuration.
    pub fn config(&self) -> &RedisStreamsConfig {
        &self.config
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisStreamsError> {
        let mut c = self.conn.get().await?;
        match invocation.invoke_async(&mut c).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn.failed(&e).await;
                Err(e.into())
            }
        }
    }

    /// Creates the consumer group at `start_id` (`0`: the whole stream; `$`: only entries added
    /// from now on), and the stream if there is none. An existing group is left as it is.
    pub async fn ensure_group(&self, start_id: &str) -> Result<(), RedisStreamsError> {
        let mut c = self.conn.get().await?;
        let r: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.config.stream)
            .arg(&self.config.group)
            .arg(start_id)
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => {
                self.conn.failed(&e).await;
                Err(e.into())
            }
        }
    }

    /// Adds an entry with `fields` to the stream (a producer's `XADD <stream> * ...`); returns
    /// its id.
    pub async fn add<V: redis::ToRedisArgs + Send + Sync>(
        &self,
        fields: &[(&str, V)],
    ) -> Result<String, RedisStreamsError> {
        let mut c = self.conn.get().await?;
        let r = redis::cmd("XADD")
            .arg(&self.config.stream)
            .arg("*")
            .arg(fields)
            .query_async(&mut c)
            .await;
        match r {
            Ok(id) => Ok(id),
            Err(e) => {
                self.conn.failed(&e).await;
                Err(e.into())
            }
        }
    }

    /// Delivers up to `max` messages: due reclaims first, then new entries, then (if none) new
    /// entries waited for up to [`RedisStreamsConfig::block`].
    pub async fn fetch(&self, max: u32) -> Result<Vec<StreamMessage>, RedisStreamsError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let cfg = &self.config;
        let mut invocation = self.fetch.key(&cfg.stream);
        invocation
            .key(cfg.dead_letter_key())
            .key(cfg.state_key("dead-letters"))
            .key(cfg.state_key("cursor"))
            .key(cfg.state_key("retry-due"))
            .arg(&cfg.group)
            .arg(&cfg.consumer)
            .arg(RETRY_CONSUMER)
            .arg(max)
            .arg(millis(cfg.visibility_timeout).max(1))
            .arg(cfg.max_deliveries)
            .arg(if cfg.delete_on_ack { "1" } else { "0" });
        let got = parse_deliveries(self.run(&invocation).await?)?;
        if !got.is_empty() || cfg.block.is_zero() {
            return Ok(got);
        }
        let mut c = self.blocking.get().await?;
        let r: Result<Value, RedisError> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&cfg.group)
            .arg(&cfg.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(millis(cfg.block).max(1))
            .arg("STREAMS")
            .arg(&cfg.stream)
            .arg(">")
            .query_async(&mut c)
            .await;
        match r {
            Ok(v) => parse_read(v),
            Err(e) => {
                self.blocking.failed(&e).await;
                Err(e.into())
            }
        }
    }

    /// Acknowledges message `id`; true when this call completed it (false when it was
    /// acknowledged or dead-lettered already).
    pub async fn ack_id(&self, id: &str) -> Result<bool, RedisStreamsError> {
        let cfg = &self.config;
        let mut invocation = self.ack.key(&cfg.stream);
        invocation
            .key(cfg.state_key("completed"))
            .key(cfg.state_key("retry-due"))
            .arg(&cfg.group)
            .arg(id)
            .arg(if cfg.delete_on_ack { "1" } else { "0" });
        let n: i64 = self.run(&invocation).await?;
        Ok(n == 1)
    }

    /// Hands message `id` back for a redelivery `delay` from now, or dead-letters it if this
    /// was its last delivery (see the [module docs](self)).
    pub async fn nack_id(&self, id: &str, delay: Duration) -> Result<Nacked, RedisStreamsError> {
        let cfg = &self.config;
        let plan = nack_plan(delay, cfg.visibility_timeout);
        let mut invocation = self.nack.key(&cfg.stream);
        invocation
            .key(cfg.state_key("retry-due"))
            .key(cfg.dead_letter_key())
            .key(cfg.state_key("dead-letters"))
            .arg(&cfg.group)
            .arg(&cfg.consumer)
            .arg(RETRY_CONSUMER)
            .arg(id)
            .arg(plan.idle_ms)
            .arg(plan.due_in_ms)
            .arg(cfg.max_deliveries)
            .arg(if cfg.delete_on_ack { "1" } else { "0" });
        let n: i64 = self.run(&invocation).await?;
        Ok(match n {
            1 => Nacked::Retry,
            2 => Nacked::DeadLettered,
            _ => Nacked::NotHeld,
        })
    }

    /// Reads the queue's counters and gauges (for this group) in one round trip.
    pub async fn stats(&self) -> Result<StreamStats, RedisStreamsError> {
        let cfg = &self.config;
        let mut invocation = self.stats.key(&cfg.stream);
        invocation
            .key(cfg.state_key("completed"))
            .key(cfg.state_key("dead-letters"))
            .arg(&cfg.group)
            .arg(RETRY_CONSUMER);
        let v: Vec<Value> = self.run(&invocation).await?;
        parse_stats(&v)
    }
}

impl Source for RedisStreamsSource {
    type Message = StreamMessage;
    type Error = RedisStreamsError;

    async fn poll(&self, max: u32) -> Result<Vec<StreamMessage>, RedisStreamsError> {
        self.fetch(max).await
    }

    async fn ack(&self, message: StreamMessage) -> Result<(), RedisStreamsError> {
        if !self.ack_id(&message.id).await? {
            tracing::debug!(id = %message.id, "redis streams: acked already (redelivered)");
        }
        Ok(())
    }

    /// Back after the visibility timeout.
    async fn nack(&self, message: StreamMessage) -> Result<(), RedisStreamsError> {
        self.nack_id(&message.id, self.config.visibility_timeout)
            .await
            .map(drop)
    }

    fn receive_count(&self, message: &StreamMessage) -> Option<u32> {
        Some(message.deliveries)
    }

    async fn nack_after(
        &self,
        message: StreamMessage,
        delay: Duration,
    ) -> Result<(), RedisStreamsError> {
        self.nack_id(&message.id, delay).await.map(drop)
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

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

/// An entry's field list `[name, value, name, value, ...]` (or a RESP3 map).
fn parse_fields(v: Option<&Value>) -> Vec<(String, Vec<u8>)> {
    match v {
        Some(Value::Array(flat)) => flat
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((text(k)?, bytes(v)?)),
                _ => None,
            })
            .collect(),
        Some(Value::Map(pairs)) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, bytes(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The fetch script's answer: `[[id, deliveries, [fields...]], ...]`.
fn parse_deliveries(v: Value) -> Result<Vec<StreamMessage>, RedisStreamsError> {
    let Value::Array(items) = v else {
        return Err(RedisStreamsError::Reply(format!("fetch: {v:?}")));
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(parts) = item else {
                return Err(RedisStreamsError::Reply(
                    "fetch: entry is not an array".into(),
                ));
            };
            let id = parts
                .first()
                .and_then(text)
                .filter(|id| !id.is_empty())
                .ok_or_else(|| RedisStreamsError::Reply("fetch: entry without id".into()))?;
            let deliveries = match parts.get(1) {
                Some(Value::Int(n)) => u32::try_from((*n).max(1)).unwrap_or(u32::MAX),
                _ => 1,
            };
            Ok(StreamMessage {
                id,
                deliveries,
                fields: parse_fields(parts.get(2)),
            })
        })
        .collect()
}

/// An `XREADGROUP` answer for one stream: nil (timed out), `[[stream, [[id, [fields]], ...]]]`
/// or a RESP3 map `{stream: [[id, [fields]], ...]}`. New entries: one delivery each.
fn parse_read(v: Value) -> Result<Vec<StreamMessage>, RedisStreamsError> {
    let entries = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => match streams.into_iter().next() {
            None => return Ok(Vec::new()),
            Some(Value::Array(mut pair)) if pair.len() == 2 => pair.swap_remove(1),
            Some(other) => {
                return Err(RedisStreamsError::Reply(format!("xreadgroup: {other:?}")));
            }
        },
        Value::Map(streams) => match streams.into_iter().next() {
            None => return Ok(Vec::new()),
            Some((_, entries)) => entries,
        },
        other => return Err(RedisStreamsError::Reply(format!("xreadgroup: {other:?}"))),
    };
    let Value::Array(entries) = entries else {
        return Err(RedisStreamsError::Reply(format!(
            "xreadgroup entries: {entries:?}"
        )));
    };
    entries
        .iter()
        .map(|e| match e {
            Value::Array(parts) => {
                let id = parts.first().and_then(text).ok_or_else(|| {
                    RedisStreamsError::Reply("xreadgroup: entry without id".into())
                })?;
                Ok(StreamMessage {
                    id,
                    deliveries: 1,
                    fields: parse_fields(parts.get(1)),
                })
            }
            other => Err(RedisStreamsError::Reply(format!(
                "xreadgroup entry: {other:?}"
            ))),
        })
        .collect()
}

/// The stats script's answer.
fn parse_stats(v: &[Value]) -> Result<StreamStats, RedisStreamsError> {
    let int = |i: usize| -> Result<i64, RedisStreamsError> {
        match v.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            other => Err(RedisStreamsError::Reply(format!("stats[{i}] = {other:?}"))),
        }
    };
    let count = |i: usize| int(i).map(|n| u64::try_from(n).unwrap_or(0));
    let now_ms = count(0)?;
    let in_stream = count(2)?;
    let pending = count(3)?;
    let oldest = v.get(5).and_then(text).unwrap_or_default();
    let lag = int(8)?;
    let undelivered = u64::try_from(lag).unwrap_or_else(|_| in_stream.saturating_sub(pending));
    Ok(StreamStats {
        now_ms,
        arrivals: count(1)?,
        in_stream,
        pending,
        awaiting_retry: count(4)?,
        undelivered,
        oldest_age_secs: id_millis(&oldest)
            .map(|ms| now_ms.saturating_sub(ms) as f64 / 1000.0)
            .unwrap_or(0.0),
        completions: count(6)?,
        dead_letters: count(7)?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn config_defaults_and_keys() {
        let c = RedisStreamsConfig::new("orders", "export", "pod-1");
        assert_eq!(c.dead_letter_key(), "orders:dlq");
        assert_eq!(c.state_key("cursor"), "orders:export:cursor");
        assert_eq!(c.visibility_timeout, Duration::from_secs(30));
        assert_eq!(c.max_deliveries, 5);
        assert!(!c.delete_on_ack);
        let c = c
            .dead_letter_stream("dead")
            .state_prefix("{q}")
            .max_deliveries(0)
            .visibility_timeout(Duration::ZERO);
        assert_eq!(c.dead_letter_key(), "dead");
        assert_eq!(c.state_key("retry-due"), "{q}:export:retry-due");
        assert_eq!(c.max_deliveries, 1);
        assert_eq!(c.visibility_timeout, Duration::from_millis(1));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn unusable_configs_are_refused() {
        for c in [
            RedisStreamsConfig::new("", "g", "c"),
            RedisStreamsConfig::new("s", "g", RETRY_CONSUMER),
            RedisStreamsConfig::new("s", "g", "c").dead_letter_stream("s"),
        ] {
            assert!(
                matches!(c.validate(), Err(RedisStreamsError::Config(_))),
                "{c:?}"
            );
        }
    }

    #[test]
    fn a_nack_delay_within_the_visibility_timeout_is_an_idle_time() {
        let vt = Duration::from_secs(30);
        assert_eq!(
            nack_plan(vt, vt),
            NackPlan {
                idle_ms: 0,
                due_in_ms: 0
            },
            "a plain nack: back after the visibility timeout"
        );
        assert_eq!(
            nack_plan(Duration::from_secs(10), vt),
            NackPlan {
                idle_ms: 20_000,
                due_in_ms: 0
            }
        );
        assert_eq!(
            nack_plan(Duration::ZERO, vt),
            NackPlan {
                idle_ms: 30_000,
                due_in_ms: 0
            }
        );
        assert_eq!(
            nack_plan(Duration::from_secs(120), vt),
            NackPlan {
                idle_ms: 0,
                due_in_ms: 120_000
            },
            "longer than the timeout: recorded as due"
        );
    }

    #[test]
    fn fetch_answers_parse() {
        let v = Value::Array(vec![
            Value::Array(vec![
                bulk("1700000000000-0"),
                Value::Int(3),
                Value::Array(vec![bulk("body"), bulk("a"), bulk("n"), Value::Int(7)]),
            ]),
            Value::Array(vec![bulk("1700000000001-0"), Value::Int(1), Value::Nil]),
        ]);
        let got = parse_deliveries(v).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].id, "1700000000000-0");
        assert_eq!(got[0].deliveries, 3);
        assert_eq!(got[0].field_str("body"), Some("a"));
        assert_eq!(got[0].field("n"), Some(&b"7"[..]));
        assert_eq!(got[0].field("missing"), None);
        assert!(got[1].fields.is_empty());
        assert!(parse_deliveries(Value::Array(vec![])).unwrap().is_empty());
        assert!(parse_deliveries(Value::Int(1)).is_err());
        assert!(
            parse_deliveries(Value::Array(vec![Value::Array(vec![bulk("")])])).is_err(),
            "an entry without id"
        );
    }

    #[test]
    fn xreadgroup_answers_parse() {
        assert!(parse_read(Value::Nil).unwrap().is_empty());
        let entries = Value::Array(vec![Value::Array(vec![
            bulk("5-1"),
            Value::Array(vec![bulk("body"), bulk("x")]),
        ])]);
        let resp2 = Value::Array(vec![Value::Array(vec![bulk("orders"), entries.clone()])]);
        let got = parse_read(resp2).unwrap();
        assert_eq!(
            got,
            vec![StreamMessage {
                id: "5-1".into(),
                deliveries: 1,
                fields: vec![("body".into(), b"x".to_vec())],
            }]
        );
        let resp3 = Value::Map(vec![(bulk("orders"), entries)]);
        assert_eq!(parse_read(resp3).unwrap(), got);
        assert!(parse_read(Value::Int(3)).is_err());
    }

    fn stats_reply(lag: i64) -> Vec<Value> {
        vec![
            Value::Int(1_700_000_010_000),
            Value::Int(100),
            Value::Int(40),
            Value::Int(10),
            Value::Int(4),
            bulk("1700000007500-0"),
            Value::Int(55),
            Value::Int(5),
            Value::Int(lag),
        ]
    }

    #[test]
    fn stats_answers_parse() {
        let s = parse_stats(&stats_reply(12)).unwrap();
        assert_eq!(
            (s.arrivals, s.in_stream, s.pending, s.awaiting_retry),
            (100, 40, 10, 4)
        );
        assert_eq!((s.completions, s.dead_letters), (55, 5));
        assert_eq!(s.undelivered, 12, "the group's lag");
        assert_eq!(s.depth(), 16);
        assert!((s.oldest_age_secs - 2.5).abs() < 1e-9, "{s:?}");
        let s = parse_stats(&stats_reply(-1)).unwrap();
        assert_eq!(s.undelivered, 30, "no lag: in the stream and not pending");
        let mut none_waiting = stats_reply(0);
        none_waiting[5] = bulk("");
        assert_eq!(parse_stats(&none_waiting).unwrap().oldest_age_secs, 0.0);
        assert!(parse_stats(&stats_reply(0)[..5]).is_err());
    }

    #[test]
    fn the_exposition_has_the_wire_contract_series() {
        let s = StreamStats {
            arrivals: 10,
            completions: 7,
            dead_letters: 1,
            undelivered: 2,
            awaiting_retry: 1,
            oldest_age_secs: 1.5,
            ..StreamStats::default()
        };
        let text = s.exposition("shop", "export\"worker");
        let labels = r#"{namespace="shop",workload="export\"worker"}"#;
        for (name, kind, value) in [
            (m::QUEUE_AGE, "gauge", "1.5"),
            (m::QUEUE_DEPTH, "gauge", "3"),
            (m::QUEUE_ARRIVALS_TOTAL, "counter", "10"),
            (m::QUEUE_COMPLETIONS_TOTAL, "counter", "7"),
            (m::QUEUE_DEAD_LETTERS_TOTAL, "counter", "1"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name}: {text}"
            );
            assert!(
                text.contains(&format!("{name}{labels} {value}\n")),
                "{name}: {text}"
            );
        }
        assert_eq!(text.lines().count(), 15);
    }

    #[test]
    fn stream_id_millis() {
        assert_eq!(id_millis("1700000000123-4"), Some(1_700_000_000_123));
        assert_eq!(id_millis(""), None);
    }
}
