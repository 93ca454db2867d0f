//! `spec.producers`: the watermarks, mode and dwells by precedence. Present only when the object
//! itself has a `spec.producers` section: a policy supplies defaults for the fields but never
//! names producers (its `defaults.producers.targetRef` is refused at admission and ignored here).

use std::time::Duration;

use backpressure_api::defaults as d;
use backpressure_api::v1alpha1::{ProducerMode, WorkerBackpressureSpec};

use super::EffectiveProducers;
use super::resolver::Resolver;

pub(super) fn resolve(
    r: &mut Resolver<'_>,
    spec: &WorkerBackpressureSpec,
) -> Option<EffectiveProducers> {
    let own = spec.producers.as_ref()?;
    let mode = r.value("producers.mode", |l| l.producers?.mode, ProducerMode::Pause);
    let depth = r.value(
        "producers.queueDepth",
        |l| l.producers?.queue_depth.clone(),
        Default::default(),
    );
    let depth_from = depth.from.clone();
    let depth = depth
        .set()
        .map(|w| (w.pause_above as f64, w.resume_below as f64));
    if let Some((pause, resume)) = depth
        && !(resume < pause && resume >= 0.0)
    {
        r.error(
            &format!("{depth_from}.resumeBelow"),
            format!("{resume} must be at least 0 and below pauseAbove {pause}"),
        );
    }
    let age = pick_age(r);
    let pause_dwell = r
        .duration(
            "producers.pauseDwell",
            |l| l.producers?.pause_dwell.as_ref(),
            d::PRODUCER_PAUSE_DWELL,
        )
        .value;
    let resume_dwell = r.duration(
        "producers.resumeDwell",
        |l| l.producers?.resume_dwell.as_ref(),
        d::PRODUCER_RESUME_DWELL,
    );
    if resume_dwell.value < Duration::from_secs(1) {
        r.error(
            &resume_dwell.from,
            format!("{:?} is shorter than 1s", resume_dwell.value),
        );
    }
    if mode.value != ProducerMode::Off {
        if own.target_ref.is_none() {
            r.error(
                "spec.producers.targetRef",
                format!(
                    "is required with mode {:?} (from {})",
                    mode.value, mode.from
                ),
            );
        }
        if depth.is_none() && age.is_none() {
            r.error(
                "spec.producers",
                "set queueDepth or queueAge watermarks (here or in a policy's defaults)".into(),
            );
        }
    }
    Some(EffectiveProducers {
        target_ref: own.target_ref.clone(),
        mode: mode.value,
        depth,
        age,
        pause_dwell,
        resume_dwell: resume_dwell.value,
    })
}

/// The queue-age watermarks from the first layer that has them, parsed; an unparsable or
/// inverted pair is an error naming the field.
fn pick_age(r: &mut Resolver<'_>) -> Option<(Duration, Duration)> {
    let (pause, resume, from) = r.layers.iter().find_map(|l| {
        let w = l.producers?.queue_age.as_ref()?;
        Some((
            w.pause_above.clone(),
            w.resume_below.clone(),
            l.source.field("producers.queueAge"),
        ))
    })?;
    match (pause.get(), resume.get()) {
        (Ok(p), Ok(q)) if q < p && p <= backpressure_api::duration::MAX_SPEC_DURATION => {
            Some((p, q))
        }
        (Ok(p), Ok(q)) => {
            r.error(
                &format!("{from}.resumeBelow"),
                format!("{resume} must be below pauseAbove {pause} (at most 24h): {q:?} ≥ {p:?}"),
            );
            None
        }
        (Err(e), _) => {
            r.error(&format!("{from}.pauseAbove"), e.to_string());
            None
        }
        (_, Err(e)) => {
            r.error(&format!("{from}.resumeBelow"), e.to_string());
            None
        }
    }
}
