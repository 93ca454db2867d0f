//! An Amazon SQS [`Source`] (feature `sqs`): a small client for the AWS JSON 1.0 protocol
//! (`X-Amz-Target: AmazonSQS.<Action>`) over reqwest, signed with AWS Signature V4, so no AWS
//! SDK is linked. Tested against moto's SQS server (`tools/sqs/moto.sh`).
//!
//! # Semantics
//!
//! - [`Source::poll`] is `ReceiveMessage` with `MaxNumberOfMessages = min(max, 10)` and a short
//!   `WaitTimeSeconds` (long polling, [`SqsSource::wait_time`]); no prefetch, so a held worker
//!   (no permits) receives nothing and the backlog stays in SQS.
//! - [`Source::ack`] is `DeleteMessage`.
//! - [`Source::nack`] is `ChangeMessageVisibility` to 0 (visible again at once).
//! - [`Source::nack_after`] is `ChangeMessageVisibility` to the delay (at most 12 h, SQS' limit),
//!   so the worker loop's redelivery backoff spaces the deliveries.
//! - [`Source::receive_count`] is the message's `ApproximateReceiveCount`.
//! - Dead letters: a message received `maxReceiveCount` times (the queue's `RedrivePolicy`)
//!   and still not deleted is moved by SQS to the policy's dead-letter queue instead of being
//!   delivered again; the source does nothing of its own. A queue without a redrive policy redelivers a failing message
//!   until its retention period ends.
//!
//! # Configuration
//!
//! [`SqsClient::from_env`] reads the usual AWS variables: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` (optional), `AWS_REGION` (or
//! `AWS_DEFAULT_REGION`), and the endpoint from `AWS_ENDPOINT_URL_SQS`, else `AWS_ENDPOINT_URL`,
//! else `https://sqs.<region>.amazonaws.com`. Secrets are never logged nor shown by `Debug`.
//! Credentials from an instance profile, IRSA web identity or SSO are not fetched: pass them in
//! through these variables or [`SqsClient::new`].
//!
//! # Queue metrics
//!
//! [`SqsQueueMetrics`] exports what a worker can measure of its queue as the wire contract's
//! series (docs/wire-contract.md §9), labelled `queue="<name>"`:
//! `backpressure_queue_depth` (`ApproximateNumberOfMessages`, polled by
//! [`SqsSource::watch_depth`]), `backpressure_queue_completions_total` (messages this worker
//! deleted) and `backpressure_sqs_first_receives_total` (messages this worker received for the
//! first time, `ApproximateReceiveCount` 1). SQS has no counter of messages sent and no age of
//! the oldest message outside CloudWatch: the SQS preset with `exporter: Worker` estimates the
//! arrival rate as first receives plus the growth of the depth and the age as the depth at the
//! first-receive rate (docs/queues.md).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::worker_loop::Source;

/// The most messages one `ReceiveMessage` returns.
pub const MAX_RECEIVE: u32 = 10;
/// The longest visibility timeout SQS accepts (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// An SQS call failed.
#[derive(Debug, thiserror::Error)]
pub enum SqsError {
    /// The client's configuration is incomplete or invalid.
    #[error("SQS configuration: {0}")]
    Config(String),
    /// The request did not get an answer.
    #[error("SQS {action}: request failed: {source}")]
    Http {
        /// The action (`ReceiveMessage`, ...).
        action: &'static str,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// SQS answered with an error.
    #[error("SQS {action}: {code}: {message} (HTTP {status})")]
    Service {
        /// The action.
        action: &'static str,
        /// The HTTP status.
        status: u16,
        /// The error's `__type` (`AWS.SimpleQueueService.NonExistentQueue`, ...).
        code: String,
        /// Its message.
        message: String,
    },
    /// SQS answered with something this client does not understand.
    #[error("SQS {action}: unexpected response: {detail}")]
    Response {
        /// The action.
        action: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// AWS credentials. `Debug` shows the access key ID only.
#[derive(Clone)]
pub struct Credentials {
    /// The access key ID.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// The session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The parts of a request that Signature V4 signs.
#[derive(Debug, Clone)]
pub struct SigningRequest<'a> {
    /// `GET`, `POST`.
    pub method: &'a str,
    /// The URI path, already URI-encoded (`/` for SQS).
    pub path: &'a str,
    /// The query string's `(name, value)` pairs, not encoded.
    pub query: &'a [(&'a str, &'a str)],
    /// The headers to sign (`host` and `x-amz-date` at least); names in any case.
    pub headers: &'a [(&'a str, &'a str)],
    /// The body.
    pub payload: &'a [u8],
}

/// The `Authorization` header of AWS Signature V4 for `req`, signed at `amz_date`
/// (`YYYYMMDD'T'HHMMSS'Z'`) for `region` and `service`.
pub fn sign_v4(
    req: &SigningRequest<'_>,
    creds: &Credentials,
    region: &str,
    service: &str,
    amz_date: &str,
) -> String {
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let mut query: Vec<(String, String)> = req
        .query
        .iter()
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    query.sort();
    let query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers {
        let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
        headers
            .entry(k.to_ascii_lowercase())
            .and_modify(|e| {
                e.push(',');
                e.push_str(&v);
            })
            .or_insert(v);
    }
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers.keys().cloned().collect::<Vec<_>>().join(";");
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method,
        req.path,
        query,
        canonical_headers,
        signed_headers,
        hex(&Sha256::digest(req.payload))
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let k_date = hmac(
        format!("AWS4{}", creds.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex(&hmac(&k_signing, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
        creds.access_key_id
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// RFC 3986 encoding of everything but the unreserved characters, as SigV4 wants.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDD'T'HHMMSS'Z'` of `t` (UTC).
pub fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A message received from SQS.
#[derive(Debug, Clone)]
pub struct SqsMessage {
    /// The message ID.
    pub message_id: String,
    /// The body.
    pub body: String,
    /// What deletes it or changes its visibility (this delivery's).
    pub receipt_handle: String,
    /// `ApproximateReceiveCount` (1 on the first delivery), if SQS sent it.
    pub receive_count: Option<u32>,
    /// `SentTimestamp`, milliseconds since the epoch.
    pub sent_timestamp_ms: Option<u64>,
    /// `ApproximateFirstReceiveTimestamp`, milliseconds since the epoch.
    pub first_receive_timestamp_ms: Option<u64>,
}

/// A minimal SQS client: the calls a worker and its tests need.
#[derive(Clone)]
pub struct SqsClient {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    host: String,
    region: String,
    creds: Credentials,
}

impl fmt::Debug for SqsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsClient")
            .field("endpoint", &self.endpoint.as_str())
            .field("region", &self.region)
            .field("creds", &self.creds)
            .finish_non_exhaustive()
    }
}

impl SqsClient {
    /// A client for the SQS endpoint `endpoint` (`https://sqs.eu-west-1.amazonaws.com`,
    /// `http://127.0.0.1:5000`) in `region`.
    pub fn new(endpoint: &str, region: &str, creds: Credentials) -> Result<Self, SqsError> {
        let endpoint = reqwest::Url::parse(endpoint)
            .map_err(|e| SqsError::Config(format!("endpoint {endpoint:?}: {e}")))?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(SqsError::Config(format!(
                "endpoint {endpoint}: not http or https"
            )));
        }
        let host = match (endpoint.host_str(), endpoint.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) => return Err(SqsError::Config(format!("endpoint {endpoint}: no host"))),
        };
        if region.is_empty() {
            return Err(SqsError::Config("no region".into()));
        }
        // reqwest is built without a default TLS crypto provider: use ring unless the
        // application installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(40))
            .build()
            .map_err(|e| SqsError::Config(format!("HTTP client: {e}")))?;
        Ok(SqsClient {
            http,
            endpoint,
            host,
            region: region.to_owned(),
            creds,
        })
    }

    /// A client configured by the AWS environment variables (see the module docs).
    pub fn from_env() -> Result<Self, SqsError> {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Like [`SqsClient::from_env`] with the variables looked up by `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, SqsError> {
        let need = |k: &str| var(k).ok_or_else(|| SqsError::Config(format!("{k} is not set")));
        let creds = Credentials {
            access_key_id: need("AWS_ACCESS_KEY_ID")?,
            secret_access_key: need("AWS_SECRET_ACCESS_KEY")?,
            session_token: var("AWS_SESSION_TOKEN"),
        };
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .ok_or_else(|| SqsError::Config("AWS_REGION is not set".into()))?;
        let endpoint = var("AWS_ENDPOINT_URL_SQS")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://sqs.{region}.amazonaws.com"));
        Self::new(&endpoint, &region, creds)
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// One signed call of `action` with `body`; the answer's JSON.
    pub async fn call(&self, action: &'static str, body: &Value) -> Result<Value, SqsError> {
        let payload = serde_json::to_vec(body).map_err(|e| SqsError::Response {
            action,
            detail: format!("encoding the request: {e}"),
        })?;
        let date = amz_date(SystemTime::now());
        let target = format!("AmazonSQS.{action}");
        const CONTENT_TYPE: &str = "application/x-amz-json-1.0";
        let mut headers = vec![
            ("content-type", CONTENT_TYPE),
            ("host", self.host.as_str()),
            ("x-amz-date", date.as_str()),
            ("x-amz-target", target.as_str()),
        ];
        if let Some(t) = &self.creds.session_token {
            headers.push(("x-amz-security-token", t.as_str()));
        }
        let auth = sign_v4(
            &SigningRequest {
                method: "POST",
                path: self.endpoint.path(),
                query: &[],
                headers: &headers,
                payload: &payload,
            },
            &self.creds,
            &self.region,
            "sqs",
            &date,
        );
        let mut req = self
            .http
            .post(self.endpoint.clone())
            .header("authorization", auth);
        for (k, v) in headers.iter().filter(|(k, _)| *k != "host") {
            req = req.header(*k, *v);
        }
        let resp = req
            .body(payload)
            .send()
            .await
            .map_err(|source| SqsError::Http { action, source })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| SqsError::Http { action, source })?;
        let value: Value = if bytes.is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_slice(&bytes).map_err(|e| SqsError::Response {
                action,
                detail: format!("HTTP {status}, not JSON: {e}"),
            })?
        };
        if !status.is_success() {
            let code = value
                .get("__type")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned();
            let message = value
                .get("message")
                .or_else(|| value.get("Message"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            return Err(SqsError::Service {
                action,
                status: status.as_u16(),
                code,
                message,
            });
        }
        Ok(value)
    }

    /// `CreateQueue`; the queue's URL.
    pub async fn create_queue(
        &self,
        name: &str,
        attributes: &BTreeMap<String, String>,
    ) -> Result<String, SqsError> {
        let v = self
            .call(
                "CreateQueue",
                &json!({"QueueName": name, "Attributes": attributes}),
            )
            .await?;
        str_field(&v, "QueueUrl", "CreateQueue")
    }

    /// `GetQueueUrl`.
    pub async fn queue_url(&self, name: &str) -> Result<String, SqsError> {
        let v = self
            .call("GetQueueUrl", &json!({"QueueName": name}))
            .await?;
        str_field(&v, "QueueUrl", "GetQueueUrl")
    }

    /// `SendMessage`; the message ID.
    pub async fn send_message(&self, queue_url: &str, body: &str) -> Result<String, SqsError> {
        let v = self
            .call(
                "SendMessage",
                &json!({"QueueUrl": queue_url, "MessageBody": body}),
            )
            .await?;
        str_field(&v, "MessageId", "SendMessage")
    }

    /// `ReceiveMessage` of at most `max` (1 to 10) messages, waiting up to `wait` (whole
    /// seconds, at most 20) for one.
    pub async fn receive_message(
        &self,
        queue_url: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<SqsMessage>, SqsError> {
        const ATTRS: [&str; 3] = [
            "ApproximateReceiveCount",
            "SentTimestamp",
            "ApproximateFirstReceiveTimestamp",
        ];
        let v = self
            .call(
                "ReceiveMessage",
                &json!({
                    "QueueUrl": queue_url,
                    "MaxNumberOfMessages": max.clamp(1, MAX_RECEIVE),
                    "WaitTimeSeconds": wait.as_secs().min(20),
                    "MessageSystemAttributeNames": ATTRS,
                    "AttributeNames": ATTRS,
                }),
            )
            .await?;
        let Some(messages) = v.get("Messages") else {
            return Ok(Vec::new());
        };
        let messages = messages.as_array().ok_or_else(|| SqsError::Response {
            action: "ReceiveMessage",
            detail: "Messages is not an array".into(),
        })?;
        messages.iter().map(parse_message).collect()
    }

    /// `DeleteMessage`.
    pub async fn delete_message(&self, queue_url: &str, receipt: &str) -> Result<(), SqsError> {
        self.call(
            "DeleteMessage",
            &json!({"QueueUrl": queue_url, "ReceiptHandle": receipt}),
        )
        .await
        .map(drop)
    }

    /// `ChangeMessageVisibility` to `timeout` (whole seconds, at most 12 h).
    pub async fn change_message_visibility(
        &self,
        queue_url: &str,
        receipt: &str,
        timeout: Duration,
    ) -> Result<(), SqsError> {
        self.call(
            "ChangeMessageVisibility",
            &json!({
                "QueueUrl": queue_url,
                "ReceiptHandle": receipt,
                "VisibilityTimeout": visibility_seconds(timeout),
            }),
        )
        .await
        .map(drop)
    }

    /// `GetQueueAttributes` of `names` (`ApproximateNumberOfMessages`, `All`, ...).
    pub async fn queue_attributes(
        &self,
        queue_url: &str,
        names: &[&str],
    ) -> Result<BTreeMap<String, String>, SqsError> {
        let v = self
            .call(
                "GetQueueAttributes",
                &json!({"QueueUrl": queue_url, "AttributeNames": names}),
            )
            .await?;
        let attrs = v
            .get("Attributes")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(attrs)
    }
}

/// The visibility timeout SQS is asked for: `d` rounded up to whole seconds, at most 12 h.
pub fn visibility_seconds(d: Duration) -> u64 {
    let d = d.min(MAX_VISIBILITY);
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn str_field(v: &Value, field: &str, action: &'static str) -> Result<String, SqsError> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| SqsError::Response {
            action,
            detail: format!("no {field}"),
        })
}

fn parse_message(m: &Value) -> Result<SqsMessage, SqsError> {
    let field = |f: &str| str_field(m, f, "ReceiveMessage");
    let attr = |a: &str| {
        m.get("Attributes")
            .and_then(|x| x.get(a))
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<u64>().ok())
    };
    Ok(SqsMessage {
        message_id: field("MessageId")?,
        body: field("Body")?,
        receipt_handle: field("ReceiptHandle")?,
        receive_count: attr("ApproximateReceiveCount").and_then(|c| u32::try_from(c).ok()),
        sent_timestamp_ms: attr("SentTimestamp"),
        first_receive_timestamp_ms: attr("ApproximateFirstReceiveTimestamp"),
    })
}

/// The queue's series a worker exports (see the module docs); register them with
/// [`SqsQueueMetrics::register`] (e.g. in [`crate::metrics::Metrics::with_registry`]'s `extra`).
#[derive(Debug, Clone, Default)]
pub struct SqsQueueMetrics {
    depth: Gauge<f64, AtomicU64>,
    completions: Counter,
    first_receives: Counter,
}

/// The series' names.
pub mod names {
    pub use backpressure_api::wire::metrics::{QUEUE_COMPLETIONS_TOTAL, QUEUE_DEPTH};
    /// Messages this worker received for the first time (`ApproximateReceiveCount` 1).
    pub const SQS_FIRST_RECEIVES_TOTAL: &str = "backpressure_sqs_first_receives_total";
    /// The label with the queue's name.
    pub const LABEL_QUEUE: &str = "queue";
}

impl SqsQueueMetrics {
    /// Registers the series in `registry`, labelled `queue="<queue>"`.
    pub fn register(&self, registry: &mut Registry, queue: &str) {
        let sub = registry.sub_registry_with_label((
            Cow::Borrowed(names::LABEL_QUEUE),
            Cow::Owned(queue.to_owned()),
        ));
        sub.register(
            names::QUEUE_DEPTH,
            "Messages available in the SQS queue (ApproximateNumberOfMessages)",
            self.depth.clone(),
        );
        sub.register(
            counter_name(names::QUEUE_COMPLETIONS_TOTAL),
            "Messages this worker deleted from the SQS queue",
            self.completions.clone(),
        );
        sub.register(
            counter_name(names::SQS_FIRST_RECEIVES_TOTAL),
            "Messages this worker received for the first time (ApproximateReceiveCount 1)",
            self.first_receives.clone(),
        );
    }

    /// The last depth polled.
    pub fn depth(&self) -> f64 {
        self.depth.get()
    }

    /// Messages deleted.
    pub fn completions(&self) -> u64 {
        self.completions.get()
    }

    /// First receives.
    pub fn first_receives(&self) -> u64 {
        self.first_receives.get()
    }
}

fn counter_name(full: &'static str) -> &'static str {
    full.strip_suffix("_total").unwrap_or(full)
}

/// The queue's name: the last path segment of its URL.
pub fn queue_name(queue_url: &str) -> &str {
    queue_url
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(queue_url)
}

/// An SQS queue as a [`Source`].
#[derive(Debug, Clone)]
pub struct SqsSource {
    client: SqsClient,
    queue_url: String,
    wait: Duration,
    metrics: SqsQueueMetrics,
}

impl SqsSource {
    /// The queue at `queue_url`, long-polling up to 1 s per receive.
    pub fn new(client: SqsClient, queue_url: impl Into<String>) -> Self {
        SqsSource {
            client,
            queue_url: queue_url.into(),
            wait: Duration::from_secs(1),
            metrics: SqsQueueMetrics::default(),
        }
    }

    /// How long a receive waits for a message (`WaitTimeSeconds`, whole seconds, at most 20;
    /// 0 is short polling). Short keeps the permits current: a poll is made with the permits
    /// free when it starts.
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The client.
    pub fn client(&self) -> &SqsClient {
        &self.client
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// The queue's metrics (register them to export them).
    pub fn metrics(&self) -> &SqsQueueMetrics {
        &self.metrics
    }

    /// `ApproximateNumberOfMessages` now; also sets the depth series.
    pub async fn poll_depth(&self) -> Result<u64, SqsError> {
        const ATTR: &str = "ApproximateNumberOfMessages";
        let attrs = self
            .client
            .queue_attributes(&self.queue_url, &[ATTR])
            .await?;
        let depth = attrs
            .get(ATTR)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| SqsError::Response {
                action: "GetQueueAttributes",
                detail: format!("no {ATTR}"),
            })?;
        self.metrics.depth.set(depth as f64);
        Ok(depth)
    }

    /// Polls the depth every `interval` until dropped (spawn it); a failed poll is logged and
    /// leaves the last value (which then goes stale in Prometheus only if the worker stops).
    pub async fn watch_depth(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.poll_depth().await {
                tracing::warn!(error = %e, queue = %queue_name(&self.queue_url), "SQS depth poll failed");
            }
        }
    }
}

impl Source for SqsSource {
    type Message = SqsMessage;
    type Error = SqsError;

    async fn poll(&self, max: u32) -> Result<Vec<SqsMessage>, SqsError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let messages = self
            .client
            .receive_message(&self.queue_url, max.min(MAX_RECEIVE), self.wait)
            .await?;
        let first = messages
            .iter()
            .filter(|m| m.receive_count == Some(1))
            .count();
        self.metrics.first_receives.inc_by(first as u64);
        Ok(messages)
    }

    async fn ack(&self, message: SqsMessage) -> Result<(), SqsError> {
        self.client
            .delete_message(&self.queue_url, &message.receipt_handle)
            .await?;
        self.metrics.completions.inc();
        Ok(())
    }

    async fn nack(&self, message: SqsMessage) -> Result<(), SqsError> {
        self.client
            .change_message_visibility(&self.queue_url, &message.receipt_handle, Duration::ZERO)
            .await
    }

    fn receive_count(&self, message: &SqsMessage) -> Option<u32> {
        message.receive_count
    }

    async fn nack_after(&self, message: SqsMessage, delay: Duration) -> Result<(), SqsError> {
        self.client
            .change_message_visibility(&self.queue_url, &message.receipt_handle, delay)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_creds() -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }

    /// The `get-vanilla` case of AWS' Signature V4 test suite.
    #[test]
    fn signs_the_published_get_vanilla_vector() {
        let auth = sign_v4(
            &SigningRequest {
                method: "GET",
                path: "/",
                query: &[],
                headers: &[
                    ("Host", "example.amazonaws.com"),
                    ("X-Amz-Date", "20150830T123600Z"),
                ],
                payload: b"",
            },
            &example_creds(),
            "us-east-1",
            "service",
            "20150830T123600Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    /// The IAM `ListUsers` example of AWS' Signature V4 documentation (a query string and a
    /// content type).
    #[test]
    fn signs_the_documented_iam_list_users_example() {
        let auth = sign_v4(
            &SigningRequest {
                method: "GET",
                path: "/",
                query: &[("Version", "2010-05-08"), ("Action", "ListUsers")],
                headers: &[
                    (
                        "Content-Type",
                        "application/x-www-form-urlencoded; charset=utf-8",
                    ),
                    ("Host", "iam.amazonaws.com"),
                    ("X-Amz-Date", "20150830T123600Z"),
                ],
                payload: b"",
            },
            &example_creds(),
            "us-east-1",
            "iam",
            "20150830T123600Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn formats_amz_dates() {
        let at = |s: u64| amz_date(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "19700101T000000Z");
        assert_eq!(at(1_440_938_160), "20150830T123600Z");
        // 2024-02-29 23:59:59, a leap day.
        assert_eq!(at(1_709_251_199), "20240229T235959Z");
    }

    #[test]
    fn configuration_comes_from_the_aws_variables_and_hides_secrets() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let c = SqsClient::from_lookup(env(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("AWS_SESSION_TOKEN", "t0k3n"),
            ("AWS_REGION", "eu-west-1"),
        ]))
        .unwrap();
        assert_eq!(c.endpoint.as_str(), "https://sqs.eu-west-1.amazonaws.com/");
        let shown = format!("{c:?}");
        assert!(shown.contains("AKID"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("t0k3n"),
            "{shown}"
        );
        let c = SqsClient::from_lookup(env(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566"),
        ]))
        .unwrap();
        assert_eq!(c.host, "127.0.0.1:4566");
        assert!(matches!(
            SqsClient::from_lookup(env(&[("AWS_ACCESS_KEY_ID", "AKID")])),
            Err(SqsError::Config(_))
        ));
    }

    #[test]
    fn visibility_is_whole_seconds_rounded_up_and_capped() {
        assert_eq!(visibility_seconds(Duration::ZERO), 0);
        assert_eq!(visibility_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(visibility_seconds(Duration::from_secs(86_400)), 43_200);
        assert_eq!(
            queue_name("http://127.0.0.1:5000/123456789012/orders"),
            "orders"
        );
    }

    #[test]
    fn parses_a_received_message() {
        let m = parse_message(&json!({
            "MessageId": "id", "Body": "b", "ReceiptHandle": "r",
            "Attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1700000000000"}
        }))
        .unwrap();
        assert_eq!(m.receive_count, Some(3));
        assert_eq!(m.sent_timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(m.first_receive_timestamp_ms, None);
        assert!(parse_message(&json!({"MessageId": "id"})).is_err());
    }
}
