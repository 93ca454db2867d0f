//! The sweep's page, `docs/sim/sweep.md`: the table of targets over seeds and the comparison
//! with the other policies.

use std::fmt::Write as _;

use super::{
    Better, HeadToHead, Provenance, ScenarioSweep, Sweep, TargetSweep, aggregate, better,
    comparator_medians, head_to_head, shortfall,
};
use crate::policy::{BP_OURS, POLICIES, Policy};
use crate::report;
use crate::scenario::Target;

fn fmt_head_to_head(h: &HeadToHead) -> String {
    let mut s = format!("{} of {}", h.at_least_as_good, h.compared);
    if h.ties > 0 {
        let _ = write!(s, " ({} tie{})", h.ties, if h.ties == 1 { "" } else { "s" });
    }
    if h.not_comparable > 0 {
        let _ = write!(s, "; {} not comparable", h.not_comparable);
    }
    s
}

/// The section "Against the other policies, on the same seeds".
fn comparison_markdown(md: &mut String, sweep: &Sweep) {
    let others: Vec<Policy> = POLICIES.into_iter().filter(|p| *p != BP_OURS).collect();
    let _ = writeln!(md, "\n## Against the other policies, on the same seeds\n");
    let _ = writeln!(
        md,
        "The targets are about our policy; the other policies ran on the same seeds and \
         are measured with the same metric (`report::policy_value`, of which \
         `report::target_value` is our column). Each cell: median / worst (seed) / seeds on \
         which that policy's value would meet our target. \"—\": the metric is a state of our \
         operator (scale-out held, ramp stages) and is not defined for the others.\n"
    );
    let _ = write!(md, "| scenario | target |");
    for p in POLICIES {
        let _ = write!(md, " {} |", p.name);
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|---|{}", "---:|".repeat(POLICIES.len()));
    for s in &sweep.scenarios {
        for t in ours_targets(s) {
            let _ = write!(
                md,
                "| {} | {} |",
                short_title(&s.scenario.title),
                report::target_label(&t.target)
            );
            for p in POLICIES {
                let cell = match t.by_policy.iter().find(|(q, _)| *q == p) {
                    Some((_, values)) => {
                        let a = aggregate(&t.target, values);
                        format!(
                            "{} / {} / {} of {}",
                            report::opt(a.median, |x| fmt_measured(&t.target, x)),
                            a.worst.map_or_else(
                                || "—".to_owned(),
                                |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                            ),
                            a.met,
                            a.n
                        )
                    }
                    None => "—".to_owned(),
                };
                let cell = if p == BP_OURS {
                    format!("**{cell}**")
                } else {
                    cell
                };
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md);
        }
    }
    let _ = writeln!(
        md,
        "\nSeeds on which ours is at least as good as each other policy (ties included): lower \
         is better for a `<=` target, higher for a `>=` target; a seed on which either value is \
         not measurable is not compared.\n"
    );
    let _ = write!(md, "| scenario | target | better |");
    for p in &others {
        let _ = write!(md, " ours vs {} |", p.name);
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|---|---|{}", "---:|".repeat(others.len()));
    for s in &sweep.scenarios {
        for t in ours_targets(s) {
            let dir = better(&t.target);
            let _ = write!(
                md,
                "| {} | {} | {} |",
                short_title(&s.scenario.title),
                report::target_label(&t.target),
                match dir {
                    Some(Better::Lower) => "lower",
                    Some(Better::Higher) => "higher",
                    None => "—",
                }
            );
            for p in &others {
                let cell = match (dir, t.by_policy.iter().find(|(q, _)| q == p)) {
                    (Some(d), Some((_, values))) => {
                        fmt_head_to_head(&head_to_head(d, &t.values, values))
                    }
                    _ => "—".to_owned(),
                };
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md);
        }
    }
    let missed: Vec<(&ScenarioSweep, &TargetSweep)> = sweep
        .scenarios
        .iter()
        .flat_map(|s| ours_targets(s).map(move |t| (s, t)))
        .filter(|(_, t)| {
            let a = aggregate(&t.target, &t.values);
            a.met < a.n
        })
        .collect();
    if missed.is_empty() {
        return;
    }
    let _ = writeln!(md, "\nThe targets missed on at least one seed:\n");
    for (s, t) in missed {
        let ours = aggregate(&t.target, &t.values);
        let mut line = format!(
            "- **{}, {}**: ours has median {} (meets it on {} of {} seeds)",
            short_title(&s.scenario.title),
            report::target_label(&t.target),
            report::opt(ours.median, |x| fmt_measured(&t.target, x)),
            ours.met,
            ours.n
        );
        let medians = comparator_medians(t);
        let describe = |p: Policy, m: f64| {
            let met = t
                .by_policy
                .iter()
                .find(|(q, _)| *q == p)
                .map_or(0, |(_, v)| aggregate(&t.target, v).met);
            format!(
                "{} ({}, meets it on {met} of {})",
                fmt_measured(&t.target, m),
                p.name,
                ours.n
            )
        };
        match (medians.first(), medians.last()) {
            (Some(&(bp, bm)), Some(&(wp, wm))) if bp != wp => {
                let _ = write!(
                    line,
                    "; the best other median is {}, the worst {}",
                    describe(bp, bm),
                    describe(wp, wm)
                );
            }
            (Some(&(bp, bm)), _) => {
                let _ = write!(line, "; the other median is {}", describe(bp, bm));
            }
            _ => line.push_str("; no other policy is measured on it"),
        }
        if let Some(d) = better(&t.target) {
            let counts: Vec<String> = t
                .by_policy
                .iter()
                .filter(|(p, _)| *p != BP_OURS)
                .map(|(p, values)| {
                    let h = head_to_head(d, &t.values, values);
                    format!("{} on {}", p.name, fmt_head_to_head(&h))
                })
                .collect();
            if !counts.is_empty() {
                let _ = write!(
                    line,
                    ". Seed by seed, ours is at least as good as {}",
                    join_and(&counts)
                );
            }
        }
        line.push('.');
        let _ = writeln!(md, "{line}");
    }
}

/// The targets of a scenario that are about ours (a target about a variant of ours, such as the
/// run without producer control, is not compared with the other policies).
fn ours_targets(s: &ScenarioSweep) -> impl Iterator<Item = &TargetSweep> {
    s.targets
        .iter()
        .filter(|t| report::target_policy(&t.target) == BP_OURS)
}

fn fmt_value(target: &Target, v: Option<f64>) -> String {
    v.map_or_else(|| "not measurable".to_owned(), |x| fmt_measured(target, x))
}

fn fmt_measured(target: &Target, v: f64) -> String {
    report::fmt_target_value_digits(target.metric, v, 3)
}

/// The page `sweep.md`: provenance, one table row per target, and what the numbers say.
pub fn markdown(sweep: &Sweep, prov: &Provenance) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Seed sweep: how robust are the targets?\n");
    let _ = writeln!(
        md,
        "Generated by `{}`. [`report.md`](report.md) checks the targets of our policy \
         (backpressure + ours) on one seed per scenario, the seed in its file. Here every \
         scenario runs with {} seeds, its file's seed `s` to `s + {}`: the seed drives the \
         Poisson arrivals, latencies, the dependency's failure draws, each pod's controller and \
         the timing, length and depth of intermittent error spikes; steps, surges and hard or \
         partial outages stay where the file puts them. All five policies run on every seed \
         (on a scenario with producer control also two variants of ours: without it, and in \
         mode Throttle): the targets below are about ours unless they name a variant (values \
         and verdicts come from the same code as the report's, `report::target_value` and \
         `report::target_met`); the other four are measured with the same metrics in the \
         section [Against the other policies, on the same seeds](#against-the-other-policies-on-the-same-seeds).\n",
        prov.command,
        sweep.seeds,
        sweep.seeds.saturating_sub(1),
    );
    let _ = writeln!(
        md,
        "**Runs:** {} runs, {:.1} simulated hours, {} simulated events in {:.1} s wall on {} \
         thread(s). Everything on this page except this line is a deterministic function of the \
         scenario files and the number of seeds.\n",
        sweep.runs,
        sweep.sim_secs / 3600.0,
        report::count(sweep.events),
        prov.wall_secs,
        prov.jobs,
    );
    let _ = writeln!(
        md,
        "| scenario | seeds | target | met | median | worst (seed) | report's seed |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for s in &sweep.scenarios {
        let seeds = match (s.seeds.first(), s.seeds.last()) {
            (Some(a), Some(b)) if a != b => format!("{a}..{b}"),
            (Some(a), _) => a.to_string(),
            _ => "—".into(),
        };
        for t in &s.targets {
            let a = aggregate(&t.target, &t.values);
            let first = t.values.first().copied();
            let met = if a.met == a.n {
                format!("{} of {}", a.met, a.n)
            } else {
                format!("**{} of {}**", a.met, a.n)
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {}{} | {} | {} | {} |",
                s.scenario.title,
                seeds,
                report::target_label(&t.target),
                met,
                if a.unmeasured > 0 {
                    format!(" ({} not measurable)", a.unmeasured)
                } else {
                    String::new()
                },
                report::opt(a.median, |x| fmt_measured(&t.target, x)),
                a.worst.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                ),
                first.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                ),
            );
            rows.push((s, t, a));
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## What the numbers say\n");
    let total = rows.len();
    let robust: Vec<_> = rows.iter().filter(|(_, _, a)| a.met == a.n).collect();
    let fragile: Vec<_> = rows.iter().filter(|(_, _, a)| a.met < a.n).collect();
    let met_on_first = rows
        .iter()
        .filter(|(_, t, _)| {
            t.values
                .first()
                .is_some_and(|(_, v)| report::target_met(&t.target, *v))
        })
        .count();
    // Which targets hold on every seed, grouped by scenario: "every target of" the scenarios
    // whose targets all hold, the labels for the others.
    let mut whole = Vec::new();
    let mut partial = Vec::new();
    for s in &sweep.scenarios {
        let held: Vec<_> = robust
            .iter()
            .filter(|(x, _, _)| std::ptr::eq(*x, s))
            .map(|(_, t, _)| report::target_label(&t.target))
            .collect();
        if held.is_empty() {
            continue;
        }
        if held.len() == s.targets.len() {
            whole.push(short_title(&s.scenario.title));
        } else {
            partial.push(format!(
                "{}: {}",
                short_title(&s.scenario.title),
                held.join("; ")
            ));
        }
    }
    let mut held = Vec::new();
    if !whole.is_empty() {
        held.push(format!("every target of {}", join_and(&whole)));
    }
    held.extend(partial);
    let _ = writeln!(
        md,
        "On the report's seeds {met_on_first} of {total} targets are met. Over {} seeds per \
         scenario, **{} of {total} hold on every seed**{}",
        sweep.seeds,
        robust.len(),
        if held.is_empty() {
            ".".to_owned()
        } else {
            format!(" ({}).", held.join("; "))
        }
    );
    if fragile.is_empty() {
        let _ = writeln!(md, "No target is missed on any seed.");
    } else {
        let _ = writeln!(md, "\nMissed on at least one seed ({}):\n", fragile.len());
        for (s, t, a) in &fragile {
            let mut line = format!(
                "- **{}, {}**: met on {} of {} seeds; median {}, worst {}",
                short_title(&s.scenario.title),
                report::target_label(&t.target),
                a.met,
                a.n,
                report::opt(a.median, |x| fmt_measured(&t.target, x)),
                a.worst.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} (seed {seed})", fmt_value(&t.target, v))
                ),
            );
            if let Some(&(seed, v)) = t.values.first() {
                let mine = shortfall(&t.target, v);
                let others = t.values.len() - 1;
                let worse = t
                    .values
                    .iter()
                    .skip(1)
                    .filter(|(_, w)| shortfall(&t.target, *w) > mine)
                    .count();
                let better = t
                    .values
                    .iter()
                    .skip(1)
                    .filter(|(_, w)| shortfall(&t.target, *w) < mine)
                    .count();
                let _ = write!(
                    line,
                    ". The report's seed {seed} measures {}; of the other {others} seeds, \
                     {worse} do worse and {better} better",
                    fmt_value(&t.target, v),
                );
            }
            line.push('.');
            let _ = writeln!(md, "{line}");
        }
    }
    comparison_markdown(&mut md, sweep);
    let _ = writeln!(md, "\n## Every seed\n");
    let _ = writeln!(md, "`seed: value` of our policy; misses in bold.\n");
    let _ = writeln!(md, "| scenario | target | values |");
    let _ = writeln!(md, "|---|---|---|");
    for (s, t, _) in &rows {
        let values = t
            .values
            .iter()
            .map(|&(seed, v)| {
                let text = format!("{seed}: {}", fmt_value(&t.target, v));
                if report::target_met(&t.target, v) {
                    text
                } else {
                    format!("**{text}**")
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            md,
            "| {} | {} | {values} |",
            short_title(&s.scenario.title),
            report::target_label(&t.target)
        );
    }
    md
}

/// "a", "a and b", "a, b and c".
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// "1. Intermittent outage" -> "scenario 1"; other titles unchanged.
fn short_title(title: &str) -> String {
    match title.split_once(". ") {
        Some((n, _)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
            format!("scenario {n}")
        }
        _ => title.to_owned(),
    }
}
