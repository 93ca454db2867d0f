//! One SVG per scenario: first-attempt queue age, replicas, fleet backoff, and dependency load
//! against capacity over time, one line per policy; with a bounded broker or producer control
//! also the broker's queue depth against its capacity and the producers' backlog.
//!
//! Failure episodes (outages and error spikes, and the capacity ramp after them) are shaded in
//! light red, darker for a higher failure probability.
//!
//! Lines, grid and frames are drawn with `plotters`' SVG backend; the text (titles, tick
//! labels, legend) is written as plain SVG `<text>` elements, so rendering the plot needs no
//! font file at build or run time (the viewer's sans-serif font is used).

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::engine::{RunOutput, Sample};
use crate::scenario::{Scenario, Timeline};

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot: {0}")]
pub struct PlotError(String);

fn err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError(format!("{e:?}"))
}

/// Colours of the policies, in [`crate::policy::for_scenario`] order ([`crate::POLICIES`],
/// then the variants of ours on a scenario with producer control).
pub const COLORS: [RGBColor; 7] = [
    RGBColor(214, 39, 40),   // greedy + KEDA queue age (Value): red
    RGBColor(127, 127, 127), // backpressure + static: grey
    RGBColor(255, 127, 14),  // backpressure + KEDA queue age (Value): orange
    RGBColor(31, 119, 180),  // backpressure + ours: blue
    RGBColor(140, 86, 75),   // greedy + KEDA lagCount: brown
    RGBColor(148, 103, 189), // ours without producer control: purple
    RGBColor(44, 160, 44),   // ours, producers Throttle: green
];

const WIDTH: u32 = 1100;
const PANEL_H: u32 = 250;
const TOP: u32 = 90;
const LEFT: u32 = 80;
const RIGHT: u32 = 30;
const GAP: u32 = 45;

struct Label {
    x: i32,
    y: i32,
    anchor: &'static str,
    size: u32,
    text: String,
    color: String,
    bold: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" tick step for a range.
fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let n = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 2.5 {
        2.5
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * mag
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Averages a per-second series into buckets of `bucket` seconds: (hours, value) points.
fn series(samples: &[Sample], bucket: usize, f: impl Fn(&Sample) -> f64) -> Vec<(f64, f64)> {
    samples
        .chunks(bucket.max(1))
        .enumerate()
        .map(|(i, c)| {
            let t = (i * bucket) as f64 + c.len() as f64 / 2.0;
            let v = c.iter().map(&f).sum::<f64>() / c.len() as f64;
            (t / 3600.0, v)
        })
        .collect()
}

type Getter = fn(&Sample) -> f64;

/// Draws the scenario's plot as an SVG document.
pub fn render(scenario: &Scenario, runs: &[RunOutput]) -> Result<String, PlotError> {
    let mut panels: Vec<(&str, Getter)> = vec![
        ("first-attempt queue age (s)", |s| f64::from(s.queue_age)),
        ("replicas (spec)", |s| f64::from(s.desired)),
        ("fleet backoff (mean of ready pods)", |s| {
            f64::from(s.backoff)
        }),
        ("dependency load (calls/s); black: capacity", |s| {
            f64::from(s.attempts)
        }),
    ];
    let broker = scenario.queue.capacity.is_some() || scenario.producers.is_some();
    if broker {
        panels.push((
            "broker queue depth (messages waiting); black: capacity (messages stored)",
            |s| s.depth as f64,
        ));
        panels.push(("messages waiting at the producers", |s| {
            s.producer_backlog as f64
        }));
    }
    let n_panels = panels.len() as u32;
    let timeline = Timeline::new(scenario);
    let height = TOP + n_panels * PANEL_H + (n_panels - 1) * GAP + 40;
    let hours = scenario.duration.secs() / 3600.0;
    let n = runs.iter().map(|r| r.samples.len()).max().unwrap_or(0);
    let bucket = n.div_ceil(900).max(1);
    let mut labels: Vec<Label> = Vec::new();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        for (k, (title, get)) in panels.iter().enumerate() {
            let y0 = TOP + k as u32 * (PANEL_H + GAP);
            let area = root
                .clone()
                .shrink((LEFT, y0), (WIDTH - LEFT - RIGHT, PANEL_H));
            let lines: Vec<Vec<(f64, f64)>> = runs
                .iter()
                .map(|r| series(&r.samples, bucket, get))
                .collect();
            let capacity = runs
                .first()
                .map(|r| series(&r.samples, bucket, |s| f64::from(s.capacity)))
                .unwrap_or_default();
            let mut ymax = lines.iter().flatten().map(|p| p.1).fold(0.0f64, f64::max);
            let mut title = (*title).to_owned();
            if k == 3 {
                let cmax = capacity.iter().map(|p| p.1).fold(0.0f64, f64::max);
                if ymax > 3.0 * cmax && cmax > 0.0 {
                    ymax = 3.0 * cmax;
                    title.push_str(" — clipped at 3× the highest capacity");
                }
                ymax = ymax.max(cmax);
            }
            if k == 2 {
                ymax = 1.0;
            }
            let cap = scenario.queue.capacity.filter(|_| k == 4).map(|c| c as f64);
            if let Some(c) = cap {
                ymax = ymax.max(c);
            }
            let ymax = if ymax <= 0.0 { 1.0 } else { ymax * 1.05 };
            let mut chart = ChartBuilder::on(&area)
                .build_cartesian_2d(0.0..hours, 0.0..ymax)
                .map_err(err)?;
            // Failure episodes (outages, spikes) as a light red band, darker when deeper.
            for e in timeline.episodes() {
                let (a, b) = (e.start / 3600.0, (e.end + e.recovery) / 3600.0);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(a, 0.0), (b.min(hours), ymax)],
                        RGBColor(214, 39, 40)
                            .mix(0.06 + 0.12 * e.failure.clamp(0.0, 1.0))
                            .filled(),
                    )))
                    .map_err(err)?;
            }
            let grey = RGBColor(225, 225, 225);
            let ystep = nice_step(ymax, 5.0);
            let mut y = 0.0;
            while y <= ymax + 1e-9 {
                chart
                    .draw_series(LineSeries::new([(0.0, y), (hours, y)], grey))
                    .map_err(err)?;
                let (px, py) = chart.backend_coord(&(0.0, y));
                labels.push(Label {
                    x: px - 6,
                    y: py + 4,
                    anchor: "end",
                    size: 11,
                    text: fmt_tick(y, ystep),
                    color: "#333".into(),
                    bold: false,
                });
                y += ystep;
            }
            let xstep = nice_step(hours, 10.0);
            let mut x = 0.0;
            while x <= hours + 1e-9 {
                chart
                    .draw_series(LineSeries::new([(x, 0.0), (x, ymax)], grey))
                    .map_err(err)?;
                let (px, py) = chart.backend_coord(&(x, 0.0));
                labels.push(Label {
                    x: px,
                    y: py + 15,
                    anchor: "middle",
                    size: 11,
                    text: format!("{}h", fmt_tick(x, xstep)),
                    color: "#333".into(),
                    bold: false,
                });
                x += xstep;
            }
            if k == 3 {
                chart
                    .draw_series(LineSeries::new(
                        capacity.iter().map(|&(t, v)| (t, v.min(ymax))),
                        BLACK.stroke_width(2),
                    ))
                    .map_err(err)?;
            }
            if let Some(c) = cap {
                chart
                    .draw_series(LineSeries::new(
                        [(0.0, c), (hours, c)],
                        BLACK.stroke_width(2),
                    ))
                    .map_err(err)?;
            }
            for (i, line) in lines.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let ours = runs[i].policy.scaler == crate::policy::Scaler::Ours;
                chart
                    .draw_series(LineSeries::new(
                        line.iter().map(|&(t, v)| (t, v.min(ymax))),
                        color.stroke_width(if ours { 2 } else { 1 }),
                    ))
                    .map_err(err)?;
            }
            area.draw(&Rectangle::new(
                [
                    (0, 0),
                    ((WIDTH - LEFT - RIGHT) as i32 - 1, PANEL_H as i32 - 1),
                ],
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
            labels.push(Label {
                x: LEFT as i32,
                y: y0 as i32 - 8,
                anchor: "start",
                size: 13,
                text: title,
                color: "#000".into(),
                bold: true,
            });
        }
        root.present().map_err(err)?;
    }
    labels.push(Label {
        x: LEFT as i32,
        y: 24,
        anchor: "start",
        size: 17,
        text: format!(
            "{} (seed {}) — shaded: dependency failure episodes and capacity ramps",
            scenario.title, scenario.seed
        ),
        color: "#000".into(),
        bold: true,
    });
    let (mut lx, mut ly) = (LEFT as i32, 48);
    for (i, r) in runs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let w = 9 * r.policy.name.len() as i32 + 40;
        if lx > LEFT as i32 && lx + w > WIDTH as i32 {
            (lx, ly) = (LEFT as i32, ly + 18);
        }
        labels.push(Label {
            x: lx,
            y: ly,
            anchor: "start",
            size: 13,
            text: format!("━ {}", r.policy.name),
            color: format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2),
            bold: true,
        });
        lx += w;
    }
    let mut text = String::new();
    for l in &labels {
        let _ = writeln!(
            text,
            r#"<text x="{}" y="{}" text-anchor="{}" font-family="sans-serif" font-size="{}" fill="{}"{}>{}</text>"#,
            l.x,
            l.y,
            l.anchor,
            l.size,
            l.color,
            if l.bold { r#" font-weight="bold""# } else { "" },
            esc(&l.text)
        );
    }
    match svg.rfind("</svg>") {
        Some(i) => svg.insert_str(i, &text),
        None => return Err(PlotError("the SVG backend wrote no closing tag".into())),
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(1.05, 5.0), 0.25);
        assert_eq!(nice_step(3700.0, 5.0), 1000.0);
    }
}
