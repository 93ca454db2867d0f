//! The policies' `spec.limits`, applied after the precedence: they win whatever the source of
//! the value, and each change is recorded in [`Effective::overrides`].

use backpressure_api::v1alpha1::Mode;

use super::resolver::Resolver;
use super::{Effective, PolicyInput};

/// Checks ramp stages: 1 to 10 stages, each in [1, 100], strictly increasing, ending at 100.
pub fn check_stages(stages: &[i32]) -> Result<(), String> {
    if stages.is_empty() || stages.len() > 10 {
        return Err(format!("{stages:?}: must have 1 to 10 stages"));
    }
    if stages.iter().any(|s| !(1..=100).contains(s)) {
        return Err(format!("{stages:?}: every stage must be in [1, 100]"));
    }
    if stages.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("{stages:?}: stages must be strictly increasing"));
    }
    if stages.last() != Some(&100) {
        return Err(format!("{stages:?}: the last stage must be 100"));
    }
    Ok(())
}

/// The most restrictive numeric limit over `policies` (first in precedence order on ties).
fn tightest<T: PartialOrd + Copy>(
    policies: &[PolicyInput<'_>],
    get: impl Fn(&PolicyInput<'_>) -> Option<T>,
) -> Option<(T, String)> {
    let mut best: Option<(T, String)> = None;
    for p in policies {
        if let Some(v) = get(p)
            && best.as_ref().is_none_or(|(b, _)| v < *b)
        {
            best = Some((v, p.name.to_owned()));
        }
    }
    best
}

/// Applies every matching policy's `spec.limits` to `eff` (see the module documentation of
/// [`resolve`](super) for the rules).
pub(super) fn apply(r: &mut Resolver<'_>, eff: &mut Effective, policies: &[PolicyInput<'_>]) {
    let limits = |p: &PolicyInput<'_>| p.spec.limits.clone().unwrap_or_default();

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_set_point) {
        if !(limit.is_finite() && limit > 0.0 && limit < 1.0) {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxSetPoint"),
                format!("{limit} is not in (0, 1)"),
            );
        } else if eff.worker.set_point > limit {
            eff.overrides.insert(
                "spec.worker.setPoint".into(),
                format!("{} lowered to {limit} by policy {by}", eff.worker.set_point),
            );
            eff.worker.set_point = limit;
        }
    }

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_replicas) {
        if limit < 1 {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxReplicas"),
                format!("{limit} must be at least 1"),
            );
        } else if eff.scaling.max_replicas > limit {
            eff.overrides.insert(
                "spec.scaling.maxReplicas".into(),
                format!(
                    "{} lowered to {limit} by policy {by}",
                    eff.scaling.max_replicas
                ),
            );
            eff.scaling.max_replicas = limit;
            if eff.scaling.min_replicas > limit {
                eff.overrides.insert(
                    "spec.scaling.minReplicas".into(),
                    format!(
                        "{} lowered to {limit} by policy {by} (maxReplicas limit)",
                        eff.scaling.min_replicas
                    ),
                );
                eff.scaling.min_replicas = limit;
            }
        }
    }

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_scale_up_pods) {
        if limit < 1 {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxScaleUpPods"),
                format!("{limit} must be at least 1"),
            );
        } else if eff.scaling.scale_up.max_pods > limit {
            eff.overrides.insert(
                "spec.scaling.scaleUp.maxPods".into(),
                format!(
                    "{} lowered to {limit} by policy {by}",
                    eff.scaling.scale_up.max_pods
                ),
            );
            eff.scaling.scale_up.max_pods = limit;
        }
    }

    if let Some(p) = policies
        .iter()
        .find(|p| limits(p).required_ramp_stages.is_some())
    {
        let required = limits(p).required_ramp_stages.unwrap_or_default();
        if let Err(message) = check_stages(&required) {
            r.error(
                &format!(
                    "BackpressurePolicy {}: spec.limits.requiredRampStages",
                    p.name
                ),
                message,
            );
        } else {
            // Policies further down that require other stages lose here, but admission checks
            // every policy: an object that sets its stages cannot satisfy them all. Say so.
            let clash: Vec<String> = policies
                .iter()
                .filter_map(|q| {
                    limits(q)
                        .required_ramp_stages
                        .filter(|other| *other != required)
                        .map(|other| format!("policy {} requires {other:?}", q.name))
                })
                .collect();
            let mut note = String::new();
            if eff.scaling.ramp_up.stages != required {
                note = format!(
                    "{:?} replaced by {required:?} required by policy {}",
                    eff.scaling.ramp_up.stages, p.name
                );
                eff.scaling.ramp_up.stages = required.clone();
            }
            if !clash.is_empty() {
                if note.is_empty() {
                    note = format!("{required:?} required by policy {}", p.name);
                }
                note.push_str(&format!(
                    "; conflicting limits: {} (the first policy in precedence wins here, and \
                     admission rejects an object that sets stages until the policies agree)",
                    clash.join(", ")
                ));
            }
            if !note.is_empty() {
                eff.overrides
                    .insert("spec.scaling.rampUp.stages".into(), note);
            }
        }
    }

    // allowedQueueSystems: every non-empty list must allow the object's system.
    let system = eff.metrics.queue.system;
    for p in policies {
        if let Some(list) = limits(p).allowed_queue_systems.filter(|l| !l.is_empty())
            && !list.contains(&system)
        {
            let names: Vec<&str> = list.iter().map(|s| s.as_str()).collect();
            r.error(
                "spec.queue.system",
                format!(
                    "{} is not allowed by policy {} (allowed: {})",
                    system.as_str(),
                    p.name,
                    names.join(", ")
                ),
            );
        }
    }

    // allowedModes: the intersection of every non-empty list.
    let mut allowed: Option<Vec<Mode>> = None;
    let mut restricting: Vec<&str> = Vec::new();
    for p in policies {
        let Some(list) = limits(p).allowed_modes.filter(|l| !l.is_empty()) else {
            continue;
        };
        restricting.push(p.name);
        allowed = Some(match allowed {
            None => list,
            Some(prev) => prev.into_iter().filter(|m| list.contains(m)).collect(),
        });
    }
    if let Some(allowed) = allowed
        && !allowed.contains(&eff.mode)
    {
        let by = restricting.join(", ");
        let replacement = [Mode::DryRun, Mode::Active, Mode::Guard]
            .into_iter()
            .find(|m| allowed.contains(m) && (*m != Mode::Guard || eff.guard.is_some()));
        match replacement {
            Some(m) => {
                eff.overrides.insert(
                    "spec.mode".into(),
                    format!(
                        "{:?} is not allowed by policy {by} (allowed: {allowed:?}); using {m:?}",
                        eff.mode
                    ),
                );
                eff.mode = m;
            }
            None => r.error(
                "spec.mode",
                format!(
                    "{:?} is not allowed by policy {by} and no allowed mode applies \
                     (allowed: {allowed:?})",
                    eff.mode
                ),
            ),
        }
    }
}
