//! `spec.queue`: the queue system the workers consume and what identifies the queue there, so
//! that the operator builds the queue queries on the metrics of that system's standard
//! exporter (docs/queues.md).

use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;

/// The queue the workers consume. The operator builds the queue age, depth, arrival-rate and
/// completion-rate queries from it (a query in `spec.metrics.queries` still wins for its
/// kind); the fleet backoff and failure rate always come from the worker library's own series.
/// Exactly the section of `system` is set (`redisStreams` for `RedisStreams`, ...), none for
/// `Custom`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.redisStreams) == (self.system == 'RedisStreams')").message("spec.queue.redisStreams must be set exactly when spec.queue.system is RedisStreams").field_path(".redisStreams"))]
#[x_kube(validation = Rule::new("has(self.rabbitMQ) == (self.system == 'RabbitMQ')").message("spec.queue.rabbitMQ must be set exactly when spec.queue.system is RabbitMQ").field_path(".rabbitMQ"))]
#[x_kube(validation = Rule::new("has(self.sqs) == (self.system == 'SQS')").message("spec.queue.sqs must be set exactly when spec.queue.system is SQS").field_path(".sqs"))]
#[x_kube(validation = Rule::new("has(self.kafka) == (self.system == 'Kafka')").message("spec.queue.kafka must be set exactly when spec.queue.system is Kafka").field_path(".kafka"))]
#[x_kube(validation = Rule::new("has(self.pubSub) == (self.system == 'PubSub')").message("spec.queue.pubSub must be set exactly when spec.queue.system is PubSub").field_path(".pubSub"))]
pub struct QueueSpec {
    /// `RedisStreams`, `RabbitMQ`, `SQS`, `Kafka`, `PubSub`, or `Custom`: the worker library's
    /// own `backpressure_queue_*` series (what an object without `spec.queue` reads), or your
    /// `spec.metrics.queries`.
    pub system: QueueSystem,

    /// A Redis stream and its consumer group, read from oliver006/redis_exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_streams: Option<RedisStreamsQueue>,

    /// A RabbitMQ queue, read from RabbitMQ's built-in Prometheus plugin (`/metrics/detailed`).
    #[serde(rename = "rabbitMQ", default, skip_serializing_if = "Option::is_none")]
    pub rabbit_mq: Option<RabbitMqQueue>,

    /// An SQS queue, read from CloudWatch through YACE or the Prometheus cloudwatch_exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs: Option<SqsQueue>,

    /// A Kafka topic and consumer group, read from a consumer-lag exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaQueue>,

    /// A Pub/Sub subscription, read from Cloud Monitoring through stackdriver_exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pub_sub: Option<PubSubQueue>,

    /// Which scrape of the exporter to read, when more than one exports the same queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<QueueExporter>,

    /// A queue sample older than this is unknown (the fleet backoff and failure rate keep
    /// `spec.metrics.staleAfter`). Defaults to `spec.metrics.staleAfter`; for `PubSub` to 5m,
    /// since Cloud Monitoring delivers samples minutes after they were taken and
    /// stackdriver_exporter exports them with their own timestamps. At most 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1h')").message("staleAfter must be greater than 0s and at most 1h"))]
    pub stale_after: Option<Duration>,
}

/// Queue systems with a preset.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
pub enum QueueSystem {
    /// Redis Streams (oliver006/redis_exporter).
    RedisStreams,
    /// RabbitMQ (the rabbitmq_prometheus plugin).
    RabbitMQ,
    /// Amazon SQS (CloudWatch through YACE or cloudwatch_exporter).
    SQS,
    /// Kafka (kafka-lag-exporter or KMinion).
    Kafka,
    /// Google Cloud Pub/Sub (stackdriver_exporter).
    PubSub,
    /// The worker library's own `backpressure_queue_*` series, or `spec.metrics.queries`.
    #[default]
    Custom,
}

impl QueueSystem {
    /// Every system, in declaration order.
    pub const ALL: [QueueSystem; 6] = [
        QueueSystem::RedisStreams,
        QueueSystem::RabbitMQ,
        QueueSystem::SQS,
        QueueSystem::Kafka,
        QueueSystem::PubSub,
        QueueSystem::Custom,
    ];

    /// The name as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueSystem::RedisStreams => "RedisStreams",
            QueueSystem::RabbitMQ => "RabbitMQ",
            QueueSystem::SQS => "SQS",
            QueueSystem::Kafka => "Kafka",
            QueueSystem::PubSub => "PubSub",
            QueueSystem::Custom => "Custom",
        }
    }
}

/// A Redis stream consumed by a consumer group (Redis 7.0 or later: the group's `lag` and
/// `entries-read`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct RedisStreamsQueue {
    /// The stream's key (redis_exporter's `stream` label).
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("stream must not contain control characters"))]
    pub stream: String,
    /// The consumer group the workers read with (the `group` label).
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("consumerGroup must not contain control characters"))]
    pub consumer_group: String,
    /// The database holding the stream (the `db` label, `db<N>`). Defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub db: Option<i32>,
}

/// A RabbitMQ queue.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct RabbitMqQueue {
    /// The queue's name (the `queue` label).
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("queue must not contain control characters"))]
    pub queue: String,
    /// Its virtual host (the `vhost` label). Defaults to `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("vhost must not contain control characters"))]
    pub vhost: Option<String>,
}

/// An SQS queue, as CloudWatch reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct SqsQueue {
    /// The queue's name (`orders`, `orders.fifo`) or URL
    /// (`https://sqs.eu-west-1.amazonaws.com/123456789012/orders`): CloudWatch's `QueueName`
    /// dimension is the name.
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^([A-Za-z0-9_-]{1,80}(\\\\.fifo)?|https://[^/]+/[0-9]+/[A-Za-z0-9_-]{1,80}(\\\\.fifo)?)$')").message("queue must be an SQS queue name (letters, digits, - and _, at most 80, optionally .fifo) or an https:// queue URL ending in one"))]
    pub queue: String,
    /// The exporter: `YACE` (yet-another-cloudwatch-exporter, the default; dimension label
    /// `dimension_QueueName`), `CloudWatchExporter` (prometheus/cloudwatch_exporter; label
    /// `queue_name`) or `Worker` (the worker library's SQS source, label `queue`; no
    /// CloudWatch, `period` unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<SqsExporter>,
    /// The CloudWatch period the exporter requests the `NumberOfMessagesSent` and
    /// `NumberOfMessagesDeleted` sums over: their value divided by it is the arrival and
    /// completion rate. Defaults to 1m; between 1m and 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('1h')").message("period must be between 1m and 1h"))]
    pub period: Option<Duration>,
}

/// Exporters of CloudWatch metrics.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SqsExporter {
    /// prometheus-community/yet-another-cloudwatch-exporter.
    #[default]
    YACE,
    /// prometheus/cloudwatch_exporter.
    CloudWatchExporter,
    /// No CloudWatch: the worker library's SQS source exports what the workers see of the
    /// queue (`backpressure_queue_depth` from `GetQueueAttributes`,
    /// `backpressure_queue_completions_total`, `backpressure_sqs_first_receives_total`, label
    /// `queue`); the age and the arrival rate are estimates (docs/queues.md).
    Worker,
}

/// A Kafka topic consumed by a consumer group.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct KafkaQueue {
    /// The topic.
    #[schemars(length(min = 1, max = 249))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9._-]+$')").message("topic must be a Kafka topic name (letters, digits, '.', '_' and '-')"))]
    pub topic: String,
    /// The consumer group the workers consume with.
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("consumerGroup must not contain control characters"))]
    pub consumer_group: String,
    /// The exporter: `KafkaLagExporter` (the default; lag in time, `cluster_name`, `group` and
    /// `topic` labels) or `KMinion` (lag in messages only, `group_id` and `topic_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<KafkaExporter>,
    /// kafka-lag-exporter's `cluster_name`, when it watches more than one cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("cluster must not contain control characters"))]
    pub cluster: Option<String>,
    /// The topic's partitions. A consumer group gives each partition to one consumer, so
    /// replicas beyond the partition count idle: the recommendation is capped here. Unset:
    /// the exporter's count (kafka-lag-exporter: the topic's partitions; KMinion: the
    /// partitions assigned in the group), and no cap while it is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub partitions: Option<i32>,
}

/// Exporters of Kafka consumer lag.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KafkaExporter {
    /// seglo/kafka-lag-exporter (or an exporter with its metric names).
    #[default]
    KafkaLagExporter,
    /// redpanda-data/kminion.
    KMinion,
}

/// A Pub/Sub subscription.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PubSubQueue {
    /// The subscription's ID (`orders-workers`) or full name
    /// (`projects/<project>/subscriptions/<id>`, which also sets `project`).
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^(projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/subscriptions/)?[A-Za-z][A-Za-z0-9._~%+-]{2,254}$')").message("subscription must be a Pub/Sub subscription ID or projects/<project>/subscriptions/<id>"))]
    pub subscription: String,
    /// The Google Cloud project (the `project_id` label), when the exporter watches more than
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z][a-z0-9-]{4,28}[a-z0-9]$')").message("project must be a Google Cloud project ID"))]
    pub project: Option<String>,
}

/// The exporter's scrape, as Prometheus labels it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct QueueExporter {
    /// Only series with this `job` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("job must not contain control characters"))]
    pub job: Option<String>,
    /// Only series with this `instance` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.matches('[\\\\x00-\\\\x1f\\\\x7f]')").message("instance must not contain control characters"))]
    pub instance: Option<String>,
}

/// What a `BackpressurePolicy` may default in `spec.queue`: how the platform's exporters are
/// scraped and how stale their samples may be. Which queue an object reads is the object's
/// own (`spec.queue.system` and its section).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct QueueDefaults {
    /// Default `spec.queue.exporter` fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<QueueExporter>,
    /// Default `spec.queue.staleAfter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1h')").message("staleAfter must be greater than 0s and at most 1h"))]
    pub stale_after: Option<Duration>,
}
