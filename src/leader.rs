//! Leader election through a coordination.k8s.io Lease.
//!
//! The holder renews the Lease every third of its duration; another replica takes it over once
//! `renewTime + leaseDurationSeconds` has passed. Updates are optimistic (resourceVersion), so
//! two candidates can never both win. All decision state lives in the objects' status, so a
//! new leader continues exactly where the old one stopped (a ramp resumes at its stage).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a Lease is valid without renewal.
    pub duration: Duration,
}

/// Why an election round failed (retried on the next round).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// API error other than a lost race.
    #[error("lease {0}")]
    Api(String, #[source] kube::Error),
}

/// One election round at `now`: returns whether this replica holds the Lease afterwards.
pub async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    now: Timestamp,
) -> Result<bool, LeaderError> {
    let secs = i32::try_from(cfg.duration.as_secs())
        .unwrap_or(i32::MAX)
        .max(1);
    let fresh_spec = |transitions: i32, acquire: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(secs),
        acquire_time: acquire.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let existing = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| LeaderError::Api(cfg.name.clone(), e))?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                ..Default::default()
            },
            spec: Some(fresh_spec(0, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(LeaderError::Api(cfg.name.clone(), e)),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let new_spec = if holder == cfg.identity {
        fresh_spec(transitions, spec.acquire_time.clone())
    } else {
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(MicroTime(renewed)), Some(d)) => {
                now.as_millisecond() > renewed.as_millisecond() + i64::from(d) * 1000
            }
            _ => true,
        };
        if !expired && !holder.is_empty() {
            return Ok(false);
        }
        fresh_spec(transitions + 1, None)
    };
    lease.spec = Some(new_spec);
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(LeaderError::Api(cfg.name.clone(), e)),
    }
}

/// Runs the election loop, publishing leadership on `tx`. Renews every third of the duration;
/// a holder that fails to renew for a whole duration reports `false` (and should stop acting).
pub async fn run(client: kube::Client, cfg: LeaseConfig, tx: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let period = cfg.duration / 3;
    let mut last_renewal: Option<tokio::time::Instant> = None;
    loop {
        let now = Timestamp::now();
        match try_acquire_or_renew(&api, &cfg, now).await {
            Ok(true) => {
                last_renewal = Some(tokio::time::Instant::now());
                if !*tx.borrow() {
                    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                }
                let _ = tx.send(true);
            }
            Ok(false) => {
                if *tx.borrow() {
                    tracing::warn!(identity = %cfg.identity, "lost the leader lease");
                }
                last_renewal = None;
                let _ = tx.send(false);
            }
            Err(e) => {
                tracing::warn!(error = %crate::errors::Chain(&e), "leader election round failed");
                if last_renewal.is_none_or(|t| t.elapsed() >= cfg.duration) && *tx.borrow() {
                    tracing::warn!("could not renew the lease within its duration; stepping down");
                    let _ = tx.send(false);
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}
