//! The plot of a recording (PNG and SVG): queue age, replicas, fleet backoff, dependency load
//! vs capacity, and dead letters over time, operator run vs KEDA; with producer
//! pods also the broker's memory against its limit and the messages waiting at the producers.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::record::{KEDA_RUN, OPERATOR, Recording, RunRecord, Sample};
use crate::scenario::Scenario;

const OP_COLOR: RGBColor = RGBColor(31, 119, 180);
const CMP_COLOR: RGBColor = RGBColor(214, 39, 40);
const CAP_COLOR: RGBColor = RGBColor(90, 90, 90);
const SHADE: RGBColor = RGBColor(255, 236, 200);

/// A plotting error.
#[derive(Debug, thiserror::Error)]
#[error("plot: {0}")]
pub struct PlotError(String);

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError(e.to_string())
}

/// Registers a system sans-serif font for text (once). Without one the plot has no text.
fn fonts() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        const CANDIDATES: [&str; 5] = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        ];
        for c in CANDIDATES {
            if let Ok(bytes) = std::fs::read(c) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

struct Panel {
    title: &'static str,
    value: fn(&Sample) -> Option<f64>,
    capacity: bool,
}

/// Bytes to MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// The panels of runs with producer pods or a bounded broker.
const PRODUCER_PANELS: [Panel; 2] = [
    Panel {
        title: "broker used memory (MiB) vs limit",
        value: |s| s.broker.map(|b| mib(b.used)),
        capacity: false,
    },
    Panel {
        title: "messages waiting at the producers",
        value: |s| s.producers.as_ref().map(|p| p.waiting as f64),
        capacity: false,
    },
];

const PANELS: [Panel; 5] = [
    Panel {
        title: "queue age (s)",
        value: |s| Some(s.queue_age),
        capacity: false,
    },
    Panel {
        title: "replicas",
        value: |s| Some(f64::from(s.replicas)),
        capacity: false,
    },
    Panel {
        title: "fleet backoff",
        value: |s| s.backoff,
        capacity: false,
    },
    Panel {
        title: "dependency load (req/s) vs capacity",
        value: |s| Some(s.dep_load),
        capacity: true,
    },
    Panel {
        title: "dead letters (time in s)",
        value: |s| Some(s.dead_lettered as f64),
        capacity: false,
    },
];

/// Writes `<stem>.png` and `<stem>.svg`.
pub fn write(scenario: &Scenario, rec: &Recording, stem: &Path) -> Result<(), PlotError> {
    let size = if has_producer_panels(rec) {
        (1200, 2000)
    } else {
        (1200, 1500)
    };
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw(&root, scenario, rec)?;
        root.present().map_err(err)?;
    }
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw(&root, scenario, rec)?;
        root.present().map_err(err)?;
    }
    Ok(())
}

fn has_producer_panels(rec: &Recording) -> bool {
    rec.runs
        .iter()
        .flat_map(|r| &r.samples)
        .any(|s| s.broker.is_some() || s.producers.is_some())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    scenario: &Scenario,
    rec: &Recording,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let text = fonts();
    root.fill(&WHITE).map_err(err)?;
    let body = if text {
        let (head, body) = root.split_vertically(60);
        head.draw(&Text::new(
            format!("{}: operator (blue) vs KEDA (red)", scenario.name),
            (20, 18),
            ("sans-serif", 24).into_font(),
        ))
        .map_err(err)?;
        body
    } else {
        root.clone()
    };
    let t_max = scenario.duration.secs();
    let (band, body) = body.split_vertically(if text { 70 } else { 30 });
    if let Some(op) = rec.run(OPERATOR) {
        draw_regimes(&band, op, t_max, text)?;
    }
    let panels: Vec<&Panel> = PANELS
        .iter()
        .chain(PRODUCER_PANELS.iter().filter(|_| has_producer_panels(rec)))
        .collect();
    let limit = scenario.queue.max_memory.map(|b| mib(b.0));
    let areas = body.split_evenly((panels.len(), 1));
    let runs: Vec<(&RunRecord, RGBColor)> = [(OPERATOR, OP_COLOR), (KEDA_RUN, CMP_COLOR)]
        .iter()
        .filter_map(|(l, c)| rec.run(l).map(|r| (r, *c)))
        .collect();
    for (area, panel) in areas.iter().zip(panels.iter().copied()) {
        let memory = panel.title == PRODUCER_PANELS[0].title;
        let mut y_max: f64 = 1.0;
        for (r, _) in &runs {
            for s in &r.samples {
                if let Some(v) = (panel.value)(s) {
                    y_max = y_max.max(v);
                }
                if panel.capacity {
                    y_max = y_max.max(s.dep_capacity);
                }
            }
        }
        if panel.title == "fleet backoff" {
            y_max = 1.0;
        }
        if memory && let Some(l) = limit {
            y_max = y_max.max(l);
        }
        y_max *= 1.08;
        let mut builder = ChartBuilder::on(area);
        builder.margin(8);
        if text {
            builder
                .caption(panel.title, ("sans-serif", 18))
                .x_label_area_size(28)
                .y_label_area_size(60);
        }
        let mut chart = builder
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)
            .map_err(err)?;
        for ph in scenario.phases.iter().filter(|p| p.highlight) {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(ph.from.secs(), 0.0), (ph.to.secs(), y_max)],
                    SHADE.filled(),
                )))
                .map_err(err)?;
        }
        let mut mesh = chart.configure_mesh();
        mesh.light_line_style(WHITE.mix(0.0));
        if !text {
            mesh.disable_x_mesh().disable_y_mesh();
        }
        mesh.draw().map_err(err)?;
        if panel.capacity
            && let Some((r, _)) = runs.first()
        {
            chart
                .draw_series(LineSeries::new(
                    r.samples.iter().map(|s| (s.t, s.dep_capacity)),
                    ShapeStyle::from(&CAP_COLOR).stroke_width(2),
                ))
                .map_err(err)?
                .label("capacity")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], CAP_COLOR.stroke_width(3))
                });
        }
        if memory && let Some(l) = limit {
            chart
                .draw_series(LineSeries::new(
                    [(0.0, l), (t_max, l)],
                    ShapeStyle::from(&CAP_COLOR).stroke_width(2),
                ))
                .map_err(err)?
                .label("maxmemory")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], CAP_COLOR.stroke_width(3))
                });
        }
        for (r, color) in &runs {
            let pts: Vec<(f64, f64)> = r
                .samples
                .iter()
                .filter_map(|s| (panel.value)(s).map(|v| (s.t, v)))
                .collect();
            let c = *color;
            let name = if r.label == OPERATOR {
                "operator"
            } else {
                "KEDA"
            };
            chart
                .draw_series(LineSeries::new(
                    pts,
                    ShapeStyle::from(color).stroke_width(2),
                ))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
                });
        }
        if text && (panel.capacity || memory || panel.title == "queue age (s)") {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK.mix(0.3))
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(err)?;
        }
    }
    Ok(())
}

fn regime_color(regime: &str) -> RGBColor {
    match regime {
        "Healthy" => RGBColor(120, 190, 120),
        "Backlogged" => RGBColor(110, 160, 220),
        "DependencyFailing" => RGBColor(230, 110, 90),
        "Recovering" => RGBColor(240, 200, 80),
        "MetricsUnavailable" => RGBColor(170, 170, 170),
        _ => RGBColor(235, 235, 235),
    }
}

/// A band of the operator's regime over time.
fn draw_regimes<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    op: &RunRecord,
    t_max: f64,
    text: bool,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let mut builder = ChartBuilder::on(area);
    builder.margin_left(8).margin_right(8);
    if text {
        builder
            .caption("operator regime", ("sans-serif", 16))
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(0f64..t_max, 0f64..1f64)
        .map_err(err)?;
    let rects = op.samples.windows(2).map(|w| {
        Rectangle::new(
            [(w[0].t, 0.0), (w[1].t, 0.55)],
            regime_color(&w[0].regime).filled(),
        )
    });
    chart.draw_series(rects).map_err(err)?;
    if text {
        let mut x = 0.0;
        for name in [
            "Healthy",
            "Backlogged",
            "DependencyFailing",
            "Recovering",
            "MetricsUnavailable",
        ] {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x + t_max * 0.005, 0.68), (x + t_max * 0.02, 0.95)],
                    regime_color(name).filled(),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    name,
                    (x + t_max * 0.025, 0.97),
                    ("sans-serif", 13).into_font().color(&BLACK),
                )))
                .map_err(err)?;
            x += t_max * 0.2;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::record::Sample;

    #[test]
    fn writes_png_and_svg() {
        let sc = Scenario::load("outage-and-recovery").unwrap();
        let run = |label: &str, grow: bool| RunRecord {
            config_end: None,
            label: label.into(),
            namespace: label.into(),
            samples: (0..170u64)
                .map(|i| {
                    let t = i as f64;
                    Sample {
                        t,
                        regime: if (30.0..80.0).contains(&t) {
                            "DependencyFailing".into()
                        } else {
                            "Healthy".into()
                        },
                        replicas: if grow && t > 40.0 { 10 } else { 2 },
                        backoff: Some(if (30.0..80.0).contains(&t) { 1.0 } else { 0.0 }),
                        queue_age: (t - 30.0).clamp(0.0, 50.0),
                        dep_load: 20.0,
                        dep_capacity: sc
                            .dependency
                            .capacity
                            .value_at(std::time::Duration::from_secs(i)),
                        dead_lettered: if grow { i / 10 } else { 0 },
                        ..Sample::default()
                    }
                })
                .collect(),
        };
        let rec = Recording {
            scenario: sc.name.clone(),
            wall_secs: 1.0,
            runs: vec![run(OPERATOR, false), run(KEDA_RUN, true)],
        };
        let dir = std::env::temp_dir().join(format!("bp-lab-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&sc, &rec, &dir.join("plot")).unwrap();
        let png = std::fs::metadata(dir.join("plot.png")).unwrap().len();
        let svg = std::fs::read_to_string(dir.join("plot.svg")).unwrap();
        assert!(png > 10_000, "{png}");
        assert!(svg.contains("<svg") && svg.matches("<polyline").count() >= 10);
        if std::env::var_os("BP_KEEP_PLOT").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn producer_panels_only_with_producer_data() {
        let sc = Scenario::load("bounded-broker").unwrap();
        let run = |label: &str, full: bool| RunRecord {
            config_end: None,
            label: label.into(),
            namespace: label.into(),
            samples: (0..180u64)
                .map(|i| Sample {
                    t: i as f64,
                    broker: Some(crate::record::BrokerMemory {
                        used: (1 << 20) + i * if full { 20_000 } else { 5_000 },
                        peak: 0,
                    }),
                    producers: Some(crate::producer::ProducerStats {
                        waiting: if full { 0 } else { i.min(60) * 10 },
                        ..Default::default()
                    }),
                    ..Sample::default()
                })
                .collect(),
        };
        let rec = Recording {
            scenario: sc.name.clone(),
            wall_secs: 1.0,
            runs: vec![run(OPERATOR, false), run(KEDA_RUN, true)],
        };
        assert!(has_producer_panels(&rec));
        assert!(!has_producer_panels(&Recording::default()));
        let dir = std::env::temp_dir().join(format!("bp-lab-plot-prod-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&sc, &rec, &dir.join("plot")).unwrap();
        let svg = std::fs::read_to_string(dir.join("plot.svg")).unwrap();
        // Five panels with two runs, two more panels with two runs, and the limit line.
        assert!(
            svg.matches("<polyline").count() >= 15,
            "{}",
            svg.matches("<polyline").count()
        );
        if std::env::var_os("BP_KEEP_PLOT").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
