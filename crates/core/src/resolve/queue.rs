//! `spec.queue`: the queue system and what identifies the queue there (the object's own), the
//! exporter's scrape labels and the queue's staleness bound (the object's, else a policy's
//! defaults, else the built-in default).

use std::time::Duration;

use backpressure_api::defaults as d;
use backpressure_api::v1alpha1::{QueueSpec, QueueSystem, WorkerBackpressureSpec};

use super::resolver::Resolver;
use super::{EffectiveQueue, QueueSource};

/// Resolves `spec.queue` of `spec`; `metrics_stale_after` is the resolved
/// `spec.metrics.staleAfter`, the default of `spec.queue.staleAfter` (5 minutes or more for
/// `PubSub`).
pub(super) fn resolve(
    r: &mut Resolver<'_>,
    spec: &WorkerBackpressureSpec,
    metrics_stale_after: Duration,
) -> EffectiveQueue {
    let system = spec
        .queue
        .as_ref()
        .map_or(QueueSystem::Custom, |q| q.system);
    let job = r.value(
        "queue.exporter.job",
        |l| l.queue_exporter?.job.clone(),
        String::new(),
    );
    let instance = r.value(
        "queue.exporter.instance",
        |l| l.queue_exporter?.instance.clone(),
        String::new(),
    );
    for p in [&job, &instance] {
        if let Err(e) = label_value(&p.value) {
            r.error(&p.from, e);
        }
    }
    let default_stale = if system == QueueSystem::PubSub {
        metrics_stale_after.max(d::PUBSUB_STALE_AFTER)
    } else {
        metrics_stale_after
    };
    let stale_after = r.duration("queue.staleAfter", |l| l.queue_stale_after, default_stale);
    if stale_after.value.is_zero() {
        r.error(&stale_after.from, "must be greater than 0".into());
    }
    let source = spec.queue.as_ref().and_then(|q| source(r, q));
    EffectiveQueue {
        system,
        source,
        job: Some(job.value).filter(|j| !j.is_empty()),
        instance: Some(instance.value).filter(|i| !i.is_empty()),
        stale_after: stale_after.value,
    }
}

/// The queue's identity from the section of its system; a missing section or an invalid name
/// is an error naming the field (admission rejects both; this covers objects stored before).
fn source(r: &mut Resolver<'_>, q: &QueueSpec) -> Option<QueueSource> {
    let missing = |r: &mut Resolver<'_>, section: &str| {
        r.error(
            &format!("spec.queue.{section}"),
            format!("required when spec.queue.system is {}", q.system.as_str()),
        );
        None
    };
    let check = |r: &mut Resolver<'_>, field: &str, value: &str| match label_value(value) {
        Ok(()) if value.is_empty() => {
            r.error(&format!("spec.queue.{field}"), "must not be empty".into());
            false
        }
        Ok(()) => true,
        Err(e) => {
            r.error(&format!("spec.queue.{field}"), e);
            false
        }
    };
    match q.system {
        QueueSystem::Custom => None,
        QueueSystem::RedisStreams => {
            let Some(s) = &q.redis_streams else {
                return missing(r, "redisStreams");
            };
            let ok = check(r, "redisStreams.stream", &s.stream)
                & check(r, "redisStreams.consumerGroup", &s.consumer_group);
            let db = s.db.unwrap_or(0);
            if db < 0 {
                r.error("spec.queue.redisStreams.db", format!("{db} is negative"));
                return None;
            }
            ok.then(|| QueueSource::RedisStreams {
                stream: s.stream.clone(),
                group: s.consumer_group.clone(),
                db,
            })
        }
        QueueSystem::RabbitMQ => {
            let Some(s) = &q.rabbit_mq else {
                return missing(r, "rabbitMQ");
            };
            let vhost = s.vhost.clone().unwrap_or_else(|| "/".to_owned());
            let ok = check(r, "rabbitMQ.queue", &s.queue) & check(r, "rabbitMQ.vhost", &vhost);
            ok.then(|| QueueSource::RabbitMq {
                queue: s.queue.clone(),
                vhost,
            })
        }
        QueueSystem::SQS => {
            let Some(s) = &q.sqs else {
                return missing(r, "sqs");
            };
            // A URL's last path segment is the queue's name.
            let name = s.queue.rsplit('/').next().unwrap_or_default().to_owned();
            let ok = check(r, "sqs.queue", &name);
            let period = match s.period.as_ref().map(|p| p.get()) {
                None => d::SQS_PERIOD,
                Some(Ok(p)) if p >= Duration::from_secs(60) && p <= Duration::from_secs(3600) => p,
                Some(Ok(p)) => {
                    r.error(
                        "spec.queue.sqs.period",
                        format!("{p:?} is not between 1m and 1h"),
                    );
                    return None;
                }
                Some(Err(e)) => {
                    r.error("spec.queue.sqs.period", e.to_string());
                    return None;
                }
            };
            ok.then(|| QueueSource::Sqs {
                queue: name,
                exporter: s.exporter.unwrap_or_default(),
                period,
            })
        }
        QueueSystem::Kafka => {
            let Some(s) = &q.kafka else {
                return missing(r, "kafka");
            };
            let mut ok = check(r, "kafka.topic", &s.topic)
                & check(r, "kafka.consumerGroup", &s.consumer_group);
            if let Some(c) = &s.cluster {
                ok &= check(r, "kafka.cluster", c);
            }
            if let Some(p) = s.partitions
                && p < 1
            {
                r.error(
                    "spec.queue.kafka.partitions",
                    format!("{p} must be at least 1"),
                );
                ok = false;
            }
            ok.then(|| QueueSource::Kafka {
                topic: s.topic.clone(),
                group: s.consumer_group.clone(),
                exporter: s.exporter.unwrap_or_default(),
                cluster: s.cluster.clone(),
                partitions: s.partitions,
            })
        }
        QueueSystem::PubSub => {
            let Some(s) = &q.pub_sub else {
                return missing(r, "pubSub");
            };
            // `projects/<project>/subscriptions/<id>` names the project too.
            let (project, id) = match s.subscription.split('/').collect::<Vec<_>>()[..] {
                ["projects", p, "subscriptions", id] => (Some(p.to_owned()), id.to_owned()),
                _ => (None, s.subscription.clone()),
            };
            let project = s.project.clone().or(project);
            let mut ok = check(r, "pubSub.subscription", &id);
            if let Some(p) = &project {
                ok &= check(r, "pubSub.project", p);
            }
            ok.then_some(QueueSource::PubSub {
                subscription: id,
                project,
            })
        }
    }
}

/// A Prometheus label value the presets put in a matcher: any text without control
/// characters (the CRD's rule; the presets quote and escape it).
fn label_value(v: &str) -> Result<(), String> {
    if v.chars().any(char::is_control) {
        Err(format!("{v:?} contains control characters"))
    } else {
        Ok(())
    }
}
