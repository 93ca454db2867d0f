//! Queue presets: the queue queries of `spec.queue`, built on the metrics the standard exporter
//! of each queue system exposes (docs/queues.md has the exporters, their configuration and the
//! limits of each preset).
//!
//! Every preset query aggregates the exporter's series of the one queue into one value and
//! labels it with the object's `namespace` and `workload` (`label_replace`), the shape the
//! operator reads. The queue's names are quoted and escaped into matchers, never spliced into
//! PromQL; the queries are then treated like an object's own `spec.metrics.queries`
//! ([`crate::tenancy::scoped_queries`]): restricted to the object's namespace (the exporter is
//! scraped in that namespace) unless a policy allows cross-namespace queries, and dated by the
//! timestamps of the series they read ([`crate::freshness`]).
//!
//! What each system gives:
//!
//! | system | age | depth | arrivals | completions | partitions |
//! |---|---|---|---|---|---|
//! | Redis Streams | stream-ID time of the group's last delivered entry (upper bound) | group lag | `entries-added` | entries read − Δ pending | – |
//! | RabbitMQ | **estimate**: ready / delivery rate | ready | published into the queue | acked (per queue on 4.x, summed over channels on 3.x) | – |
//! | SQS (CloudWatch) | `ApproximateAgeOfOldestMessage` | `ApproximateNumberOfMessagesVisible` | `NumberOfMessagesSent` / period | `NumberOfMessagesDeleted` / period | – |
//! | SQS (`Worker`) | **estimate**: depth / first-receive rate | `ApproximateNumberOfMessages` polled by the workers | **estimate**: first receives + Δ depth | messages the workers deleted | – |
//! | Kafka (kafka-lag-exporter) | lag in seconds (max over partitions) | lag in offsets | log-end offsets | committed offsets | partitions of the topic |
//! | Kafka (KMinion) | **estimate**: lag / consumption rate | lag in offsets | high-water marks | committed offsets | partitions assigned in the group |
//! | Pub/Sub | `oldest_unacked_message_age` | `num_undelivered_messages` | acks + Δ backlog | `ack_message_count` | – |

use std::time::Duration;

use backpressure_api::defaults as d;
use backpressure_api::duration::format_duration;
use backpressure_api::v1alpha1::{KafkaExporter, SqsExporter};
use promql_parser::util::escape_string;

use crate::resolve::{EffectiveQueue, QueueSource};

/// The queries of one preset; `None` where the system's exporter has nothing honest to offer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresetQueries {
    /// Age in seconds of the oldest message not yet delivered (see each system's caveats).
    pub queue_age: Option<String>,
    /// Messages waiting.
    pub queue_depth: Option<String>,
    /// Messages arriving per second.
    pub arrival_rate: Option<String>,
    /// Messages completed per second.
    pub completion_rate: Option<String>,
    /// The most consumers that can work at once (Kafka: partitions), when the exporter counts
    /// them and the object does not state them.
    pub partitions: Option<String>,
}

/// The preset queries of `queue` for the object in `namespace` reading `workload`, with `rate()`
/// over `rate_window`; `None` for `Custom` (the default queries or `spec.metrics.queries`).
pub fn preset_queries(
    queue: &EffectiveQueue,
    namespace: &str,
    workload: &str,
    rate_window: Duration,
) -> Option<PresetQueries> {
    let b = Builder {
        queue,
        namespace,
        workload,
    };
    let w = format_duration(rate_window);
    let q = match queue.source.as_ref()? {
        QueueSource::RedisStreams { stream, group, db } => {
            let db = format!("db{db}");
            let g = [
                ("db", db.as_str()),
                ("stream", stream.as_str()),
                ("group", group.as_str()),
            ];
            let s = [("db", db.as_str()), ("stream", stream.as_str())];
            let lag = b.sel("redis_stream_group_lag", &g);
            let delivered = b.sel("redis_stream_group_last_delivered_id", &g);
            let first = b.sel("redis_stream_first_entry_id", &s);
            let read = b.sel("redis_stream_group_entries_read", &g);
            let pending = b.sel("redis_stream_group_messages_pending", &g);
            let added = b.sel("redis_stream_entries_added_total", &s);
            PresetQueries {
                // The oldest entry not delivered to the group is the first one after the
                // group's last delivered ID and the stream's first entry: its age is at most
                // the age of the later of the two (stream IDs are milliseconds when
                // auto-generated), counted while the group lags.
                queue_age: Some(format!(
                    "clamp_min(min(timestamp({delivered}) - {delivered} / 1000 or timestamp({first}) - {first} / 1000), 0) * on () (max({lag}) > bool 0)"
                )),
                queue_depth: Some(format!("max({lag})")),
                // `entries-added` (redis_exporter 1.88 and later), else what the group read
                // plus the growth of its lag.
                arrival_rate: Some(format!(
                    "sum(rate({added}[{w}])) or clamp_min(sum(rate({read}[{w}])) + sum(deriv({lag}[{w}])), 0)"
                )),
                // Read for the first time, less the growth of the pending entries list: acked.
                completion_rate: Some(format!(
                    "clamp_min(sum(rate({read}[{w}])) - sum(deriv({pending}[{w}])), 0)"
                )),
                partitions: None,
            }
        }
        QueueSource::RabbitMq { queue: name, vhost } => {
            // `rabbitmq_prometheus` on `/metrics/detailed`. RabbitMQ 4.0 and later have per-queue
            // counters (`queue_delivery_metrics`, `queue_exchange_metrics`); 3.x has only
            // per-channel ones (`channel_queue_metrics`, `channel_queue_exchange_metrics`, whose
            // published counter labels the queue's vhost `queue_vhost`), summed over channels:
            // each rate reads the per-queue counter, or else the per-channel ones (checked
            // against a real 3.10.8, tests/it/presets.rs).
            let q = [("vhost", vhost.as_str()), ("queue", name.as_str())];
            let ready = b.sel("rabbitmq_detailed_queue_messages_ready", &q);
            // Deliveries with manual ack, pushed (`basic.consume`) and pulled (`basic.get`):
            // two counters, told apart by a label before they are summed (`rate` over one
            // selector of both names gives two series with the same labels, an error; `+`
            // would be empty when an exporter lacks one of them).
            let delivered = |prefix: &str| {
                let push = b.sel(&format!("{prefix}_messages_delivered_ack_total"), &q);
                let pull = b.sel(&format!("{prefix}_get_ack_total"), &q);
                format!(
                    "sum(label_replace(rate({push}[{w}]), \"delivery\", \"push\", \"\", \"\") or label_replace(rate({pull}[{w}]), \"delivery\", \"pull\", \"\", \"\"))"
                )
            };
            let (delivered, delivered_3) = (
                delivered("rabbitmq_detailed_queue"),
                delivered("rabbitmq_detailed_channel"),
            );
            let published = b.sel(
                "rabbitmq_detailed_queue_exchange_messages_published_total",
                &q,
            );
            let published_3 = b.sel(
                "rabbitmq_detailed_queue_messages_published_total",
                &[("queue_vhost", vhost.as_str()), ("queue", name.as_str())],
            );
            let acked = b.sel("rabbitmq_detailed_queue_messages_acked_total", &q);
            let acked_3 = b.sel("rabbitmq_detailed_channel_messages_acked_total", &q);
            PresetQueries {
                // No age metric: an estimate, the time the ready messages take at the current
                // rate of deliveries with manual ack, pushed (`basic.consume`) or pulled
                // (`basic.get`, as the worker library's source does): 0 when none is ready,
                // unknown while nothing is delivered.
                queue_age: Some(format!(
                    "(max({ready}) == 0) or max({ready}) / ({delivered} or {delivered_3})"
                )),
                queue_depth: Some(format!("max({ready})")),
                arrival_rate: Some(format!(
                    "sum(rate({published}[{w}])) or sum(rate({published_3}[{w}]))"
                )),
                completion_rate: Some(format!(
                    "sum(rate({acked}[{w}])) or sum(rate({acked_3}[{w}]))"
                )),
                partitions: None,
            }
        }
        QueueSource::Sqs {
            queue: name,
            exporter: SqsExporter::Worker,
            ..
        } => {
            let q = [("queue", name.as_str())];
            let depth = b.sel("backpressure_queue_depth", &q);
            let deleted = b.sel("backpressure_queue_completions_total", &q);
            let first = b.sel("backpressure_sqs_first_receives_total", &q);
            PresetQueries {
                // No age outside CloudWatch: an estimate, the time the visible messages take at
                // the rate they are first received (0 when none waits, unknown while nothing
                // is received).
                queue_age: Some(format!(
                    "(max({depth}) == 0) or max({depth}) / sum(rate({first}[{w}]))"
                )),
                // Every replica polls `ApproximateNumberOfMessages` of the one queue.
                queue_depth: Some(format!("max({depth})")),
                // No counter of messages sent: those first received plus the growth of the
                // visible messages.
                arrival_rate: Some(format!(
                    "clamp_min(sum(rate({first}[{w}])) + max(deriv({depth}[{w}])), 0)"
                )),
                completion_rate: Some(format!("sum(rate({deleted}[{w}]))")),
                partitions: None,
            }
        }
        QueueSource::Sqs {
            queue: name,
            exporter,
            period,
        } => {
            let dim = match exporter {
                SqsExporter::YACE => "dimension_QueueName",
                SqsExporter::CloudWatchExporter => "queue_name",
                SqsExporter::Worker => "queue",
            };
            let q = [(dim, name.as_str())];
            let age = b.sel("aws_sqs_approximate_age_of_oldest_message_maximum", &q);
            let visible = b.sel_re(
                "aws_sqs_approximate_number_of_messages_visible_(maximum|average)",
                &q,
            );
            let sent = b.sel("aws_sqs_number_of_messages_sent_sum", &q);
            let deleted = b.sel("aws_sqs_number_of_messages_deleted_sum", &q);
            let p = period.as_secs().max(1);
            PresetQueries {
                queue_age: Some(format!("max({age})")),
                queue_depth: Some(format!("max({visible})")),
                arrival_rate: Some(format!("sum({sent}) / {p}")),
                completion_rate: Some(format!("sum({deleted}) / {p}")),
                partitions: None,
            }
        }
        QueueSource::Kafka {
            topic,
            group,
            exporter: KafkaExporter::KafkaLagExporter,
            cluster,
            partitions,
        } => {
            let mut g = vec![("group", group.as_str()), ("topic", topic.as_str())];
            let mut t = vec![("topic", topic.as_str())];
            if let Some(c) = cluster {
                g.push(("cluster_name", c.as_str()));
                t.push(("cluster_name", c.as_str()));
            }
            let lag_seconds = b.sel("kafka_consumergroup_group_lag_seconds", &g);
            let lag = b.sel("kafka_consumergroup_group_lag", &g);
            let latest = b.sel("kafka_partition_latest_offset", &t);
            let committed = b.sel("kafka_consumergroup_group_offset", &g);
            PresetQueries {
                queue_age: Some(format!("max({lag_seconds})")),
                queue_depth: Some(format!("sum({lag})")),
                arrival_rate: Some(format!("sum(rate({latest}[{w}]))")),
                completion_rate: Some(format!("sum(rate({committed}[{w}]))")),
                partitions: partitions.is_none().then(|| format!("count({latest})")),
            }
        }
        QueueSource::Kafka {
            topic,
            group,
            exporter: KafkaExporter::KMinion,
            partitions,
            ..
        } => {
            let g = [("group_id", group.as_str()), ("topic_name", topic.as_str())];
            let t = [("topic_name", topic.as_str())];
            let lag = b.sel("kminion_kafka_consumer_group_topic_lag", &g);
            let committed = b.sel("kminion_kafka_consumer_group_topic_offset_sum", &g);
            let high = b.sel("kminion_kafka_topic_high_water_mark_sum", &t);
            let assigned = b.sel("kminion_kafka_consumer_group_topic_assigned_partitions", &g);
            PresetQueries {
                // No lag in time: an estimate, the lag at the current consumption rate (0
                // without lag, unknown while nothing is consumed).
                queue_age: Some(format!(
                    "(max({lag}) == 0) or max({lag}) / sum(rate({committed}[{w}]))"
                )),
                queue_depth: Some(format!("max({lag})")),
                arrival_rate: Some(format!("sum(rate({high}[{w}]))")),
                completion_rate: Some(format!("sum(rate({committed}[{w}]))")),
                partitions: partitions.is_none().then(|| format!("max({assigned})")),
            }
        }
        QueueSource::PubSub {
            subscription,
            project,
        } => {
            let mut s = vec![("subscription_id", subscription.as_str())];
            if let Some(p) = project {
                s.push(("project_id", p.as_str()));
            }
            let m = |suffix: &str| {
                b.sel(
                    &format!(
                        "stackdriver_pubsub_subscription_pubsub_googleapis_com_subscription_{suffix}"
                    ),
                    &s,
                )
            };
            let (age, backlog, acks) = (
                m("oldest_unacked_message_age"),
                m("num_undelivered_messages"),
                m("ack_message_count"),
            );
            // Cloud Monitoring samples once a minute: a shorter window holds too few samples.
            let w = format_duration(rate_window.max(d::PUBSUB_MIN_RATE_WINDOW));
            PresetQueries {
                queue_age: Some(format!("max({age})")),
                queue_depth: Some(format!("max({backlog})")),
                // What was acked plus the growth of the backlog.
                arrival_rate: Some(format!(
                    "clamp_min(sum(rate({acks}[{w}])) + sum(deriv({backlog}[{w}])), 0)"
                )),
                completion_rate: Some(format!("sum(rate({acks}[{w}]))")),
                partitions: None,
            }
        }
    };
    Some(PresetQueries {
        queue_age: q.queue_age.map(|e| b.label(&e)),
        queue_depth: q.queue_depth.map(|e| b.label(&e)),
        arrival_rate: q.arrival_rate.map(|e| b.label(&e)),
        completion_rate: q.completion_rate.map(|e| b.label(&e)),
        partitions: q.partitions.map(|e| b.label(&e)),
    })
}

struct Builder<'a> {
    queue: &'a EffectiveQueue,
    namespace: &'a str,
    workload: &'a str,
}

impl Builder<'_> {
    /// `{__name__="<name>", <labels>, job=..., instance=...}`, every value quoted and escaped.
    fn sel(&self, name: &str, labels: &[(&str, &str)]) -> String {
        self.selector(&format!("__name__=\"{}\"", escape_string(name)), labels)
    }

    /// Like [`Builder::sel`] with a regular expression on the name (a constant of the preset).
    fn sel_re(&self, name_re: &str, labels: &[(&str, &str)]) -> String {
        self.selector(&format!("__name__=~\"{}\"", escape_string(name_re)), labels)
    }

    fn selector(&self, name: &str, labels: &[(&str, &str)]) -> String {
        let mut parts = vec![name.to_owned()];
        let scrape = [
            ("job", self.queue.job.as_deref()),
            ("instance", self.queue.instance.as_deref()),
        ];
        for (k, v) in labels.iter().map(|(k, v)| (*k, Some(*v))).chain(scrape) {
            if let Some(v) = v {
                parts.push(format!("{k}=\"{}\"", escape_string(v)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }

    /// `expr` labelled with the object's namespace and workload.
    fn label(&self, expr: &str) -> String {
        format!(
            "label_replace(label_replace({expr}, \"namespace\", {}, \"\", \"\"), \"workload\", {}, \"\", \"\")",
            replacement(self.namespace),
            replacement(self.workload)
        )
    }
}

/// A `label_replace` replacement that expands to `value` itself: quoted, escaped, and `$`
/// doubled (a replacement's `$1` refers to a capture group).
fn replacement(value: &str) -> String {
    format!("\"{}\"", escape_string(&value.replace('$', "$$")))
}

#[cfg(test)]
mod tests;
