use backpressure_api::v1alpha1::{ProducerMode, ProducerState, ProducerStatus};
use proptest::prelude::*;

use super::tests::{at, depth, eff};
use super::*;

fn mode() -> impl Strategy<Value = ProducerMode> {
    prop_oneof![Just(ProducerMode::Pause), Just(ProducerMode::Throttle)]
}

proptest! {
    /// Noise between the watermarks (depth in [resumeBelow, pauseAbove]) never changes the
    /// state, whatever state the producers were in and whatever the rates do: that is the
    /// hysteresis. (A resuming fleet may only lower its rate there, never change state.)
    #[test]
    fn noise_between_the_watermarks_never_changes_the_state(
        mode in mode(),
        start in 0usize..3,
        noise in prop::collection::vec((200.0f64..=800.0, 0.0f64..100.0, 0.0f64..100.0), 1..60),
    ) {
        let e = eff(mode);
        // Get into the starting state: Open, restricted, or resuming.
        let mut prev: Option<ProducerStatus> = None;
        let mut t = 0;
        let warmup: &[f64] = match start { 0 => &[], 1 => &[900.0], _ => &[900.0, 100.0] };
        for d in warmup {
            prev = Some(decide_producers(&e, prev.as_ref(), &depth(*d, 50.0, 50.0), at(t)).status);
            t += 60;
        }
        let initial = prev.as_ref().map_or(ProducerState::Open, |p| p.state);
        for (d, c, a) in noise {
            let out = decide_producers(&e, prev.as_ref(), &depth(d, c, a), at(t));
            prop_assert_eq!(out.status.state, initial);
            if initial != ProducerState::Resuming {
                prop_assert!(out.event.is_none());
            }
            prev = Some(out.status);
            t += 17;
        }
    }

    /// Same inputs, same decision; and fed its own status back with the same inputs at the same
    /// time, nothing changes (no event, equal status).
    #[test]
    fn the_decision_is_a_function_of_its_inputs(
        mode in mode(),
        path in prop::collection::vec((0.0f64..2000.0, 0.0f64..100.0, 0.0f64..100.0, 1i64..200), 1..40),
    ) {
        let e = eff(mode);
        let mut prev: Option<ProducerStatus> = None;
        let mut t = 0;
        for (d, c, a, dt) in path {
            t += dt;
            let fleet = depth(d, c, a);
            let one = decide_producers(&e, prev.as_ref(), &fleet, at(t));
            let two = decide_producers(&e, prev.as_ref(), &fleet, at(t));
            prop_assert_eq!(&one, &two);
            let again = decide_producers(&e, Some(&one.status), &fleet, at(t));
            prop_assert_eq!(&again.status, &one.status);
            prop_assert!(again.event.is_none());
            prev = Some(one.status);
        }
    }

    /// Producers become restricted only with some signal above its high watermark, and leave a
    /// restriction (Paused or Throttled) only with every signal below its low watermark.
    #[test]
    fn transitions_need_the_watermark_they_cross(
        mode in mode(),
        path in prop::collection::vec((0.0f64..2000.0, 0.0f64..100.0, 0.0f64..100.0, 1i64..200), 1..60),
    ) {
        let e = eff(mode);
        let mut prev: Option<ProducerStatus> = None;
        let mut t = 0;
        for (d, c, a, dt) in path {
            t += dt;
            let out = decide_producers(&e, prev.as_ref(), &depth(d, c, a), at(t));
            let was = prev.as_ref().map_or(ProducerState::Open, |p| p.state);
            let now = out.status.state;
            let restricted = |s| matches!(s, ProducerState::Paused | ProducerState::Throttled);
            if !restricted(was) && restricted(now) {
                prop_assert!(d > 800.0, "restricted at depth {d}");
            }
            if restricted(was) && !restricted(now) {
                prop_assert!(d < 200.0, "resumed at depth {d}");
            }
            if was == ProducerState::Open && now != ProducerState::Open {
                prop_assert!(restricted(now));
            }
            prev = Some(out.status);
        }
    }
}
