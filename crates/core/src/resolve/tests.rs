#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use backpressure_api::v1alpha1::{
    BackpressurePolicy, BackpressurePolicySpec, Brake, FallbackPolicy, GuardKind, GuardRef,
    HoldSpec, MetricsFallback, MetricsSpec, Mode, PolicyDefaults, PolicyLimits, QueryOverrides,
    RampUpSpec, RedeliverySpec, ReleaseSpec, ScaleUpSpec, ScalingSpec, TargetRef,
    WorkerBackpressureSpec, WorkerSpec,
};
use backpressure_api::wire::WorkerConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn spec() -> WorkerBackpressureSpec {
    WorkerBackpressureSpec {
        target_ref: TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "export-worker".into(),
        },
        ..Default::default()
    }
}

fn policy(name: &str, priority: Option<i32>, spec: BackpressurePolicySpec) -> BackpressurePolicy {
    let mut p = BackpressurePolicy::new(name, BackpressurePolicySpec { priority, ..spec });
    p.metadata.name = Some(name.to_owned());
    p
}

fn scaling_defaults(scaling: ScalingSpec) -> BackpressurePolicySpec {
    BackpressurePolicySpec {
        defaults: Some(PolicyDefaults {
            scaling: Some(scaling),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn inputs(policies: &[BackpressurePolicy]) -> Vec<PolicyInput<'_>> {
    policies.iter().map(PolicyInput::from_policy).collect()
}

fn dur(s: &str) -> Option<backpressure_api::Duration> {
    Some(s.parse().unwrap())
}

#[test]
fn builtin_defaults_fill_an_empty_spec() {
    let eff = resolve(&spec(), &[], now()).unwrap();
    assert_eq!(eff.mode, Mode::Active);
    assert!(!eff.dry_run);
    assert_eq!(eff.worker.set_point, 0.05);
    assert_eq!(eff.worker.max_permits, 16);
    assert_eq!(eff.worker.reaction, 20);
    assert_eq!(eff.metrics.workload, "export-worker");
    assert_eq!(eff.metrics.address, None);
    assert_eq!(eff.metrics.stale_after, Duration::from_secs(60));
    let s = &eff.scaling;
    assert_eq!((s.min_replicas, s.max_replicas), (1, 10));
    assert_eq!(s.target_queue_age, Duration::from_secs(60));
    assert_eq!(s.hold.backoff_above, 0.2);
    assert_eq!(s.hold.for_, Duration::from_secs(30));
    assert!(!s.hold.allow_scale_in);
    assert_eq!(s.release.backoff_below, 0.05);
    assert_eq!(s.release.for_, Duration::from_secs(60));
    assert_eq!((s.scale_up.max_pods, s.scale_up.max_percent), (4, 100));
    assert_eq!(s.scale_up.period, Duration::from_secs(15));
    assert_eq!(s.scale_down.max_percent, 10);
    assert_eq!(s.scale_down.stabilization, Duration::from_secs(300));
    assert_eq!(s.ramp_up.stages, vec![25, 50, 75, 100]);
    assert_eq!(s.ramp_up.dwell, Duration::from_secs(60));
    assert_eq!(s.on_metrics_unavailable, Fallback::Hold);
    assert!(eff.overrides.is_empty());
    assert!(eff.policies.is_empty());
}

#[test]
fn reaction_default_follows_max_permits() {
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        max_permits: Some(64),
        ..Default::default()
    });
    assert_eq!(resolve(&s, &[], now()).unwrap().worker.reaction, 64);
}

#[test]
fn precedence_object_then_policies_by_priority_then_name_then_defaults() {
    let hold = |above: f64| ScalingSpec {
        hold: Some(HoldSpec {
            backoff_above: Some(above),
            ..Default::default()
        }),
        ..Default::default()
    };
    let policies = vec![
        policy("zeta", Some(10), scaling_defaults(hold(0.5))),
        policy("alpha", Some(10), scaling_defaults(hold(0.4))),
        policy(
            "low",
            Some(-5),
            scaling_defaults(ScalingSpec {
                max_replicas: Some(33),
                hold: Some(HoldSpec {
                    backoff_above: Some(0.9),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        ),
        policy(
            "high",
            Some(100),
            scaling_defaults(ScalingSpec {
                min_replicas: Some(2),
                ..Default::default()
            }),
        ),
    ];
    let eff = resolve(&spec(), &inputs(&policies), now()).unwrap();
    // Priority 100 first, then the two priority-10 policies by name, then priority -5.
    assert_eq!(eff.policies, vec!["high", "alpha", "zeta", "low"]);
    assert_eq!(
        eff.scaling.hold.backoff_above, 0.4,
        "tie broken by name: alpha"
    );
    assert_eq!(eff.scaling.min_replicas, 2, "from high");
    assert_eq!(eff.scaling.max_replicas, 33, "only low sets it");
    assert_eq!(eff.scaling.release.backoff_below, 0.05, "built-in default");

    // The object's own value beats every policy.
    let mut s = spec();
    s.scaling = Some(hold(0.3));
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    assert_eq!(eff.scaling.hold.backoff_above, 0.3);

    // The order of the input does not matter.
    let mut reversed = inputs(&policies);
    reversed.reverse();
    assert_eq!(
        resolve(&s, &reversed, now()).unwrap(),
        resolve(&s, &inputs(&policies), now()).unwrap()
    );
}

#[test]
fn limits_always_win_and_are_recorded() {
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        set_point: Some(0.3),
        ..Default::default()
    });
    s.scaling = Some(ScalingSpec {
        min_replicas: Some(8),
        max_replicas: Some(50),
        scale_up: Some(ScaleUpSpec {
            max_pods: Some(20),
            ..Default::default()
        }),
        ramp_up: Some(RampUpSpec {
            stages: Some(vec![50, 100]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let limits = |l: PolicyLimits| BackpressurePolicySpec {
        limits: Some(l),
        ..Default::default()
    };
    let policies = vec![
        policy(
            "platform-limits",
            None,
            limits(PolicyLimits {
                max_set_point: Some(0.2),
                max_replicas: Some(20),
                max_scale_up_pods: Some(5),
                required_ramp_stages: Some(vec![10, 30, 60, 100]),
                ..Default::default()
            }),
        ),
        policy(
            "stricter",
            Some(-1),
            limits(PolicyLimits {
                max_replicas: Some(6),
                max_set_point: Some(0.25),
                ..Default::default()
            }),
        ),
    ];
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    assert_eq!(eff.worker.set_point, 0.2);
    assert_eq!(eff.scaling.max_replicas, 6, "most restrictive limit binds");
    assert_eq!(eff.scaling.min_replicas, 6, "min follows a lowered max");
    assert_eq!(eff.scaling.scale_up.max_pods, 5);
    assert_eq!(eff.scaling.ramp_up.stages, vec![10, 30, 60, 100]);
    let o = &eff.overrides;
    assert_eq!(
        o["spec.worker.setPoint"],
        "0.3 lowered to 0.2 by policy platform-limits"
    );
    assert_eq!(
        o["spec.scaling.maxReplicas"],
        "50 lowered to 6 by policy stricter"
    );
    assert!(
        o["spec.scaling.minReplicas"].contains("8 lowered to 6"),
        "{o:?}"
    );
    assert!(o["spec.scaling.scaleUp.maxPods"].contains("20 lowered to 5"));
    assert!(o["spec.scaling.rampUp.stages"].contains("[50, 100] replaced by [10, 30, 60, 100]"));
    assert_eq!(o.len(), 5);

    // Within limits: nothing recorded.
    let eff = resolve(&spec(), &inputs(&policies[..1]), now()).unwrap();
    assert_eq!(eff.worker.set_point, 0.05);
    assert_eq!(eff.scaling.max_replicas, 10);
    assert_eq!(
        eff.overrides.len(),
        1,
        "only the required stages: {:?}",
        eff.overrides
    );
}

#[test]
fn allowed_modes_intersect_and_replace() {
    let allow = |name: &str, modes: Vec<Mode>| {
        policy(
            name,
            None,
            BackpressurePolicySpec {
                limits: Some(PolicyLimits {
                    allowed_modes: Some(modes),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    };
    let policies = vec![
        allow("a", vec![Mode::DryRun, Mode::Guard]),
        allow("b", vec![Mode::DryRun, Mode::Active]),
    ];
    let eff = resolve(&spec(), &inputs(&policies), now()).unwrap();
    assert_eq!(eff.mode, Mode::DryRun);
    assert!(eff.dry_run);
    assert!(eff.overrides["spec.mode"].contains("Active is not allowed by policy a, b"));

    // Guard only, but the object has no guard ref: no mode applies.
    let only_guard = vec![allow("g", vec![Mode::Guard])];
    let err = resolve(&spec(), &inputs(&only_guard), now()).unwrap_err();
    assert_eq!(err.errors[0].field, "spec.mode");

    let mut s = spec();
    s.guard = Some(GuardRef {
        kind: GuardKind::HorizontalPodAutoscaler,
        name: "hpa".into(),
    });
    assert_eq!(
        resolve(&s, &inputs(&only_guard), now()).unwrap().mode,
        Mode::Guard
    );
}

#[test]
fn fleet_dry_run_and_brake() {
    let at = |s: i64| Some(Time(Timestamp::from_second(s).unwrap()));
    let brake = |min: f64, expires: Option<Time>| BackpressurePolicySpec {
        brake: Some(Brake {
            min_backoff: min,
            expires_at: expires,
            reason: Some("incident 42".into()),
        }),
        ..Default::default()
    };
    let policies = vec![
        policy(
            "fleet",
            Some(1),
            BackpressurePolicySpec {
                dry_run: Some(true),
                ..brake(0.3, None)
            },
        ),
        policy("expired", None, brake(0.9, at(now().as_second() - 1))),
        policy("pending", None, brake(0.5, at(now().as_second() + 600))),
    ];
    let eff = resolve(&spec(), &inputs(&policies), now()).unwrap();
    assert!(eff.dry_run);
    assert_eq!(eff.dry_run_by.as_deref(), Some("policy fleet"));
    assert_eq!(
        eff.mode,
        Mode::Active,
        "fleet DryRun does not change the mode"
    );
    let b = eff.brake.clone().unwrap();
    assert_eq!((b.min_backoff, b.policy.as_str()), (0.5, "pending"));
    let cfg = render_worker_config(&eff, eff.worker.set_point, 3);
    assert_eq!(
        cfg.brake.as_ref().unwrap().expires_at_unix,
        Some(now().as_second() + 600)
    );
    assert_eq!(cfg.active_brake(now().as_second()), Some(0.5));

    // Ten minutes later the brake of "pending" has lifted itself; "fleet" has no expiry.
    let later = Timestamp::from_second(now().as_second() + 600).unwrap();
    let eff = resolve(&spec(), &inputs(&policies), later).unwrap();
    assert_eq!(eff.brake.unwrap().policy, "fleet");
}

#[test]
fn errors_name_every_field_and_never_panic() {
    let mut s = spec();
    s.scaling = Some(ScalingSpec {
        min_replicas: Some(12),
        target_queue_age: Some(backpressure_api::Duration::from_std(Duration::ZERO)),
        release: Some(ReleaseSpec {
            backoff_below: Some(0.5),
            ..Default::default()
        }),
        ramp_up: Some(RampUpSpec {
            stages: Some(vec![50, 40]),
            ..Default::default()
        }),
        on_metrics_unavailable: Some(MetricsFallback {
            policy: Some(FallbackPolicy::Static),
            replicas: None,
        }),
        ..Default::default()
    });
    s.worker = Some(WorkerSpec {
        set_point: Some(1.5),
        ..Default::default()
    });
    s.mode = Some(Mode::Guard);
    // A bad duration coming from a policy default names the policy.
    let policies = vec![policy(
        "broken",
        None,
        serde_json::from_value(serde_json::json!({
            "defaults": {"scaling": {"hold": {"for": "5 minutes"}}}
        }))
        .unwrap(),
    )];
    let err = resolve(&s, &inputs(&policies), now()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    for want in [
        "spec.worker.setPoint",
        "spec.scaling.minReplicas",
        "spec.scaling.targetQueueAge",
        "spec.scaling.release.backoffBelow",
        "spec.scaling.rampUp.stages",
        "spec.scaling.onMetricsUnavailable.replicas",
        "BackpressurePolicy broken: spec.defaults.scaling.hold.for",
        "spec.guard",
    ] {
        assert!(fields.contains(&want), "missing {want} in {fields:?}");
    }
    let text = err.to_string();
    assert!(
        text.contains("minReplicas 12 exceeds maxReplicas 10"),
        "{text}"
    );
    assert!(
        text.contains("0.5 must be below hold.backoffAbove 0.2"),
        "{text}"
    );
}

#[test]
fn release_not_below_hold_after_merging_is_an_error() {
    // Each value alone is fine; the combination of object and policy is not.
    let mut s = spec();
    s.scaling = Some(ScalingSpec {
        release: Some(ReleaseSpec {
            backoff_below: Some(0.15),
            ..Default::default()
        }),
        ..Default::default()
    });
    let policies = vec![policy(
        "tight",
        None,
        scaling_defaults(ScalingSpec {
            hold: Some(HoldSpec {
                backoff_above: Some(0.1),
                ..Default::default()
            }),
            ..Default::default()
        }),
    )];
    let err = resolve(&s, &inputs(&policies), now()).unwrap_err();
    assert_eq!(err.errors.len(), 1);
    assert_eq!(err.errors[0].field, "spec.scaling.release.backoffBelow");
    assert!(err.errors[0].message.contains("BackpressurePolicy tight"));
}

#[test]
fn durations_and_queries_merge_per_field() {
    let mut s = spec();
    s.metrics = Some(MetricsSpec {
        queries: Some(QueryOverrides {
            backoff: Some("avg by (namespace, workload) (x)".into()),
            queue_age: Some("  ".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    s.scaling = Some(ScalingSpec {
        hold: Some(HoldSpec {
            for_: dur("1m30s"),
            ..Default::default()
        }),
        ..Default::default()
    });
    let policies = vec![policy(
        "q",
        None,
        BackpressurePolicySpec {
            defaults: Some(PolicyDefaults {
                metrics: Some(MetricsSpec {
                    queries: Some(QueryOverrides {
                        backoff: Some("ignored".into()),
                        queue_age: Some("max by (namespace, workload) (age)".into()),
                        ..Default::default()
                    }),
                    stale_after: dur("2m"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    )];
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    assert_eq!(eff.scaling.hold.for_, Duration::from_secs(90));
    assert_eq!(eff.metrics.stale_after, Duration::from_secs(120));
    let q = &eff.metrics.queries;
    assert_eq!(
        q.backoff.as_deref(),
        Some("avg by (namespace, workload) (x)")
    );
    assert_eq!(
        q.queue_age.as_deref(),
        Some("max by (namespace, workload) (age)"),
        "a blank query is unset"
    );
    assert_eq!(q.arrival_rate, None);
}

#[test]
fn worker_config_renders_with_hash() {
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        set_point: Some(0.1),
        max_permits: Some(8),
        ..Default::default()
    });
    let eff = resolve(&s, &[], now()).unwrap();
    let cfg = render_worker_config(&eff, eff.worker.set_point, 7);
    assert_eq!(cfg.generation, 7);
    assert_eq!(cfg.set_point, 0.1);
    assert_eq!(cfg.max_permits, 8);
    assert_eq!(cfg.reaction, 20);
    assert_eq!((cfg.probe_initial_ms, cfg.probe_max_ms), (2000, 60_000));
    assert_eq!(cfg.brake, None);
    cfg.validate().unwrap();
    let bytes = serde_json::to_vec(&cfg).unwrap();
    assert_eq!(WorkerConfig::parse(&bytes).unwrap(), cfg);
    // Defaults render the same payload as the wire contract's default.
    let default_eff = resolve(&spec(), &[], now()).unwrap();
    let default_cfg = render_worker_config(&default_eff, default_eff.worker.set_point, 0);
    assert_eq!(default_cfg, WorkerConfig::default());
}

#[test]
fn policies_for_namespace_filters_and_orders() {
    let sel = |k: &str, v: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([(k.to_owned(), v.to_owned())])),
        match_expressions: None,
    };
    let with_selector = |name: &str, prio: i32, s: Option<LabelSelector>| {
        policy(
            name,
            Some(prio),
            BackpressurePolicySpec {
                namespace_selector: s,
                ..Default::default()
            },
        )
    };
    let all = vec![
        with_selector("everyone", 0, None),
        with_selector("payments", 5, Some(sel("team", "payments"))),
        with_selector("search", 9, Some(sel("team", "search"))),
    ];
    let labels = BTreeMap::from([("team".to_owned(), "payments".to_owned())]);
    let names: Vec<&str> = policies_for_namespace(&all, &labels)
        .iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, vec!["payments", "everyone"]);
}

#[test]
fn config_generation_keeps_growing_across_a_recreated_object() {
    let now: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
    let t = now.as_millisecond();
    // Same content: same generation, whatever the clock says.
    assert_eq!(next_config_generation(Some(("abc", 7)), "abc", now), 7);
    // New content: at least the clock, and always past the previous one.
    assert_eq!(next_config_generation(Some(("abc", 7)), "def", now), t);
    assert_eq!(
        next_config_generation(Some(("abc", t + 5)), "def", now),
        t + 6
    );
    // No previous status (a new, recreated or status-less object): the clock, so a pod still
    // running the old object's config accepts the push instead of answering 409.
    let before = next_config_generation(Some(("abc", 41)), "def", now);
    let recreated = next_config_generation(None, "def", now + Duration::from_secs(60));
    assert!(recreated > before);
    assert_eq!(
        next_config_generation(Some(("abc", i64::MAX)), "def", now),
        i64::MAX
    );
}

#[test]
fn conflicting_required_ramp_stages_are_reported() {
    let requiring = |name: &str, priority: i32, stages: Vec<i32>| {
        policy(
            name,
            Some(priority),
            BackpressurePolicySpec {
                limits: Some(PolicyLimits {
                    required_ramp_stages: Some(stages),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    };
    // Two policies that agree: no conflict, and the built-in stages are replaced as before.
    let agree = vec![
        requiring("a", 5, vec![10, 50, 100]),
        requiring("b", 1, vec![10, 50, 100]),
    ];
    let eff = resolve(&spec(), &inputs(&agree), now()).unwrap();
    assert_eq!(eff.scaling.ramp_up.stages, vec![10, 50, 100]);
    let note = &eff.overrides["spec.scaling.rampUp.stages"];
    assert!(note.ends_with("required by policy a"), "{note}");

    // Two that differ: the first in precedence wins, and the clash is said.
    let clash = vec![
        requiring("a", 5, vec![10, 50, 100]),
        requiring("b", 1, vec![20, 100]),
    ];
    let eff = resolve(&spec(), &inputs(&clash), now()).unwrap();
    assert_eq!(eff.scaling.ramp_up.stages, vec![10, 50, 100]);
    let note = &eff.overrides["spec.scaling.rampUp.stages"];
    assert!(
        note.contains("conflicting limits: policy b requires [20, 100]"),
        "{note}"
    );

    // The clash is said even when the object already has the winning stages.
    let mut s = spec();
    s.scaling = Some(ScalingSpec {
        ramp_up: Some(RampUpSpec {
            stages: Some(vec![10, 50, 100]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let eff = resolve(&s, &inputs(&clash), now()).unwrap();
    let note = &eff.overrides["spec.scaling.rampUp.stages"];
    assert!(
        note.starts_with("[10, 50, 100] required by policy a; conflicting limits"),
        "{note}"
    );
}

#[test]
fn a_tiny_set_point_or_a_duration_over_a_day_is_an_error_naming_the_field() {
    // What the CRD rejects at admission, for an object stored before those rules.
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        set_point: Some(1e-12),
        ..Default::default()
    });
    s.scaling = Some(ScalingSpec {
        ramp_up: Some(RampUpSpec {
            dwell: dur("1000h"),
            ..Default::default()
        }),
        hold: Some(HoldSpec {
            for_: dur("24h1s"),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = resolve(&s, &[], now()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    for want in [
        "spec.worker.setPoint",
        "spec.scaling.hold.for",
        "spec.scaling.rampUp.dwell",
    ] {
        assert!(fields.contains(&want), "missing {want} in {fields:?}");
    }
    assert!(
        err.to_string().contains("longer than the maximum of 24h"),
        "{err}"
    );

    // The bounds themselves are accepted.
    s.worker = Some(WorkerSpec {
        set_point: Some(backpressure_api::defaults::MIN_SET_POINT),
        ..Default::default()
    });
    s.scaling = Some(ScalingSpec {
        ramp_up: Some(RampUpSpec {
            dwell: dur("24h"),
            ..Default::default()
        }),
        ..Default::default()
    });
    resolve(&s, &[], now()).unwrap();
}

#[test]
fn optional_worker_settings_render_only_when_set_and_keep_old_hashes() {
    // Unset anywhere: left out of the payload, so the hash of a payload of an object that does
    // not use them is what it was before the fields existed.
    let plain_eff = resolve(&spec(), &[], now()).unwrap();
    let plain = render_worker_config(&plain_eff, plain_eff.worker.set_point, 0);
    let json = serde_json::to_value(&plain).unwrap();
    for absent in [
        "initialPermits",
        "ratioWindowMs",
        "brakeReleaseMs",
        "floorMax",
        "redelivery",
    ] {
        assert!(json.get(absent).is_none(), "{absent} in {json}");
    }
    // Recomputed outside Rust: the first 12 hex digits of the SHA-256 of
    // `json.dumps(payload, sort_keys=True, separators=(",", ":"))` in Python, which for this
    // payload (ASCII names, no float that formats otherwise) is its RFC 8785 form.
    assert_eq!(
        plain.hash, "7485623321e4",
        "the default payload's hash changed"
    );
    // The 0.1 hash of the same payload (serde_json's field order), pinned here before the
    // change to RFC 8785, is what the legacy hash still computes.
    #[allow(deprecated)]
    let legacy = plain.legacy_hash();
    assert_eq!(legacy, "7142b90d3b19", "the legacy hash changed");

    // Set on the object, or by a policy's defaults: rendered.
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        initial_permits: Some(0),
        ratio_window: dur("10s"),
        floor_max: Some(0.0),
        redelivery: Some(RedeliverySpec {
            base: dur("30s"),
            max: None,
        }),
        ..Default::default()
    });
    let policies = vec![policy(
        "gentle",
        None,
        serde_json::from_value(serde_json::json!({
            "defaults": {"worker": {"brakeRelease": "2m", "initialPermits": 4}}
        }))
        .unwrap(),
    )];
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    let w = &eff.worker;
    assert_eq!(
        w.initial_permits,
        Some(0),
        "the object wins over the policy"
    );
    assert_eq!(w.ratio_window, Some(Duration::from_secs(10)));
    assert_eq!(w.brake_release, Some(Duration::from_secs(120)));
    assert_eq!(w.floor_max, Some(0.0));
    // Only the base set: the max is the default.
    assert_eq!(
        w.redelivery,
        Some((Duration::from_secs(30), Duration::from_secs(480)))
    );
    let cfg = render_worker_config(&eff, eff.worker.set_point, 1);
    assert_eq!(cfg.initial_permits, Some(0));
    assert_eq!(cfg.ratio_window_ms, Some(10_000));
    assert_eq!(cfg.brake_release_ms, Some(120_000));
    assert_eq!(cfg.floor_max, Some(0.0));
    assert_eq!(
        cfg.redelivery,
        Some(backpressure_api::wire::RedeliveryConfig {
            base_ms: 30_000,
            max_ms: 480_000
        })
    );
    cfg.validate().unwrap();
    assert_ne!(cfg.hash, plain.hash);
}

#[test]
fn optional_worker_settings_out_of_range_name_the_field() {
    let mut s = spec();
    s.worker = Some(WorkerSpec {
        initial_permits: Some(5000),
        ratio_window: dur("0s"),
        brake_release: dur("2h"),
        floor_max: Some(0.95),
        redelivery: Some(RedeliverySpec {
            base: dur("10m"),
            max: dur("5m"),
        }),
        ..Default::default()
    });
    let err = resolve(&s, &[], now()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    for want in [
        "spec.worker.initialPermits",
        "spec.worker.ratioWindow",
        "spec.worker.brakeRelease",
        "spec.worker.floorMax",
        "spec.worker.redelivery.base",
    ] {
        assert!(fields.contains(&want), "missing {want} in {fields:?}");
    }
    s.worker = Some(WorkerSpec {
        redelivery: Some(RedeliverySpec {
            base: None,
            max: dur("13h"),
        }),
        ..Default::default()
    });
    let err = resolve(&s, &[], now()).unwrap_err();
    assert!(
        err.errors
            .iter()
            .any(|e| e.field == "spec.worker.redelivery.max"),
        "{err}"
    );
}

/// Issue 16: `spec.worker.push` (metrics-only workers) resolves like the other worker fields,
/// object over policy over the default (`Enabled`), and stays out of the payload: the hash of
/// the config the workers would run does not change with it.
#[test]
fn worker_push_resolves_by_precedence_and_stays_out_of_the_payload() {
    let eff = resolve(&spec(), &inputs(&[]), now()).unwrap();
    assert!(eff.worker.push, "pushes by default");
    let pushed = render_worker_config(&eff, eff.worker.set_point, 1).with_hash();

    let policies = vec![policy(
        "metrics-only",
        None,
        serde_json::from_value(serde_json::json!({"defaults": {"worker": {"push": "Disabled"}}}))
            .unwrap(),
    )];
    let eff = resolve(&spec(), &inputs(&policies), now()).unwrap();
    assert!(!eff.worker.push, "the policy's default applies");
    assert_eq!(
        render_worker_config(&eff, eff.worker.set_point, 1)
            .with_hash()
            .hash,
        pushed.hash
    );

    let mut s = spec();
    s.worker = Some(serde_json::from_value(serde_json::json!({"push": "Enabled"})).unwrap());
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    assert!(eff.worker.push, "the object wins over the policy");
}

#[test]
fn producers_take_policy_defaults_but_only_the_object_names_them() {
    use backpressure_api::v1alpha1::{AgeWatermarks, DepthWatermarks, ProducerMode, ProducersSpec};
    let producer = TargetRef {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "export-api".into(),
    };
    // No spec.producers: no producer control, whatever a policy defaults.
    let defaults = BackpressurePolicySpec {
        defaults: Some(PolicyDefaults {
            producers: Some(ProducersSpec {
                mode: Some(ProducerMode::Throttle),
                queue_depth: Some(DepthWatermarks {
                    pause_above: 10_000,
                    resume_below: 2_000,
                }),
                pause_dwell: dur("2m"),
                // A policy cannot name producers (refused at admission); ignored here.
                target_ref: Some(TargetRef {
                    name: "someone-else".into(),
                    ..producer.clone()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let policies = [policy("platform", None, defaults)];
    assert_eq!(
        resolve(&spec(), &inputs(&policies), now())
            .unwrap()
            .producers,
        None
    );

    let mut s = spec();
    s.producers = Some(ProducersSpec {
        target_ref: Some(producer.clone()),
        queue_age: Some(AgeWatermarks {
            pause_above: "10m".parse().unwrap(),
            resume_below: "2m".parse().unwrap(),
        }),
        ..Default::default()
    });
    let p = resolve(&s, &inputs(&policies), now())
        .unwrap()
        .producers
        .unwrap();
    assert_eq!(p.target_ref, Some(producer.clone()));
    assert_eq!(p.mode, ProducerMode::Throttle);
    assert_eq!(p.depth, Some((10_000.0, 2_000.0)));
    assert_eq!(
        p.age,
        Some((Duration::from_secs(600), Duration::from_secs(120)))
    );
    assert_eq!(p.pause_dwell, Duration::from_secs(120));
    assert_eq!(p.resume_dwell, Duration::from_secs(60));

    // Without the policy: Pause by default, and watermarks are required.
    s.producers = Some(ProducersSpec {
        target_ref: Some(producer),
        ..Default::default()
    });
    let err = resolve(&s, &[], now()).unwrap_err();
    assert_eq!(err.errors[0].field, "spec.producers", "{err}");
}

#[test]
fn inverted_producer_watermarks_stored_before_the_crd_are_refused_naming_the_field() {
    use backpressure_api::v1alpha1::{AgeWatermarks, DepthWatermarks, ProducerMode, ProducersSpec};
    let mut s = spec();
    s.producers = Some(ProducersSpec {
        mode: Some(ProducerMode::Pause),
        queue_depth: Some(DepthWatermarks {
            pause_above: 100,
            resume_below: 100,
        }),
        queue_age: Some(AgeWatermarks {
            pause_above: "1m".parse().unwrap(),
            resume_below: "5m".parse().unwrap(),
        }),
        ..Default::default()
    });
    let err = resolve(&s, &[], now()).unwrap_err();
    let fields: Vec<_> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.producers.queueDepth.resumeBelow",
            "spec.producers.queueAge.resumeBelow",
            "spec.producers.targetRef"
        ]
    );
}

fn with_queue(queue: backpressure_api::v1alpha1::QueueSpec) -> WorkerBackpressureSpec {
    WorkerBackpressureSpec {
        queue: Some(queue),
        ..spec()
    }
}

#[test]
fn the_queue_is_the_objects_and_the_exporter_scrape_takes_policy_defaults() {
    use backpressure_api::v1alpha1::{
        PubSubQueue, QueueDefaults, QueueExporter, QueueSpec, QueueSystem, SqsExporter, SqsQueue,
    };
    // No spec.queue: Custom, as fresh as the metrics.
    let eff = resolve(&spec(), &[], now()).unwrap();
    assert_eq!(
        eff.metrics.queue,
        EffectiveQueue::custom(Duration::from_secs(60))
    );

    let platform = policy(
        "platform",
        None,
        BackpressurePolicySpec {
            defaults: Some(PolicyDefaults {
                queue: Some(QueueDefaults {
                    exporter: Some(QueueExporter {
                        job: Some("yace".into()),
                        instance: None,
                    }),
                    stale_after: dur("3m"),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let s = with_queue(QueueSpec {
        system: QueueSystem::SQS,
        sqs: Some(SqsQueue {
            queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo".into(),
            exporter: None,
            period: dur("5m"),
        }),
        exporter: Some(QueueExporter {
            job: None,
            instance: Some("yace-0:5000".into()),
        }),
        ..Default::default()
    });
    let policies = [platform];
    let eff = resolve(&s, &inputs(&policies), now()).unwrap();
    let q = &eff.metrics.queue;
    assert_eq!(q.system, QueueSystem::SQS);
    assert_eq!(
        q.source,
        Some(QueueSource::Sqs {
            queue: "orders.fifo".into(),
            exporter: SqsExporter::YACE,
            period: Duration::from_secs(300),
        }),
        "a URL's last segment is the name"
    );
    assert_eq!(q.job.as_deref(), Some("yace"), "the policy's default");
    assert_eq!(
        q.instance.as_deref(),
        Some("yace-0:5000"),
        "the object's own"
    );
    assert_eq!(q.stale_after, Duration::from_secs(180));

    // Pub/Sub: a full subscription name names the project; staleness at least 5 minutes.
    let s = with_queue(QueueSpec {
        system: QueueSystem::PubSub,
        pub_sub: Some(PubSubQueue {
            subscription: "projects/shop-prod/subscriptions/orders-workers".into(),
            project: None,
        }),
        ..Default::default()
    });
    let eff = resolve(&s, &[], now()).unwrap();
    assert_eq!(
        eff.metrics.queue.source,
        Some(QueueSource::PubSub {
            subscription: "orders-workers".into(),
            project: Some("shop-prod".into()),
        })
    );
    assert_eq!(eff.metrics.queue.stale_after, Duration::from_secs(300));
    assert_eq!(eff.metrics.stale_after, Duration::from_secs(60));
}

#[test]
fn a_queue_without_its_section_a_bad_name_or_a_system_a_policy_forbids_is_an_error() {
    use backpressure_api::v1alpha1::{KafkaQueue, QueueSpec, QueueSystem, RedisStreamsQueue};
    let fields = |s: &WorkerBackpressureSpec, p: &[BackpressurePolicy]| -> Vec<String> {
        resolve(s, &inputs(p), now())
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    };
    let missing = with_queue(QueueSpec {
        system: QueueSystem::Kafka,
        ..Default::default()
    });
    assert_eq!(
        fields(&missing, &[]),
        ["spec.queue.kafka: required when spec.queue.system is Kafka"]
    );
    let control = with_queue(QueueSpec {
        system: QueueSystem::RedisStreams,
        redis_streams: Some(RedisStreamsQueue {
            stream: "orders\n".into(),
            consumer_group: String::new(),
            db: None,
        }),
        ..Default::default()
    });
    let e = fields(&control, &[]);
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("spec.queue.redisStreams.stream: "),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("spec.queue.redisStreams.consumerGroup: must not be empty"),
        "{e:?}"
    );

    let kafka = with_queue(QueueSpec {
        system: QueueSystem::Kafka,
        kafka: Some(KafkaQueue {
            topic: "orders".into(),
            consumer_group: "workers".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let only_redis = policy(
        "redis-only",
        None,
        BackpressurePolicySpec {
            limits: Some(PolicyLimits {
                allowed_queue_systems: Some(vec![QueueSystem::RedisStreams, QueueSystem::Custom]),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let policies = [only_redis];
    assert_eq!(
        fields(&kafka, &policies),
        [
            "spec.queue.system: Kafka is not allowed by policy redis-only (allowed: RedisStreams, Custom)"
        ]
    );
    // Custom (no spec.queue) is allowed there, and anything where no list restricts.
    assert!(resolve(&spec(), &inputs(&policies), now()).is_ok());
    assert!(resolve(&kafka, &[], now()).is_ok());
}
