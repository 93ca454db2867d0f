//! The plot of a recording (PNG and SVG): queue age, replicas, fleet backoff, dependency load
//! vs capacity, and dead letters over time, operator run vs the queue-age scaler.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::record::{HPA_LIKE, OPERATOR, Recording, RunRecord, Sample};
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
        title: "dead letters",
        value: |s| Some(s.dead_lettered as f64),
        capacity: false,
    },
];

/// Writes `<stem>.png` and `<stem>.svg`.
pub fn write(scenario: &Scenario, rec: &Recording, stem: &Path) -> Result<(), PlotError> {
    let size = (1200, 1500);
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
            format!(
                "{}: operator (blue) vs queue-age scaler (red)",
                scenario.name
            ),
            (20, 18),
            ("sans-serif", 24).into_font(),
        ))
        .map_err(err)?;
        body
    } else {
        root.clone()
    };
    let t_max = scenario.duration.secs();
    let areas = body.split_evenly((PANELS.len(), 1));
    let runs: Vec<(&RunRecord, RGBColor)> = [(OPERATOR, OP_COLOR), (HPA_LIKE, CMP_COLOR)]
        .iter()
        .filter_map(|(l, c)| rec.run(l).map(|r| (r, *c)))
        .collect();
    for (area, panel) in areas.iter().zip(PANELS.iter()) {
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
                .map_err(err)?;
        }
        for (r, color) in &runs {
            let pts: Vec<(f64, f64)> = r
                .samples
                .iter()
                .filter_map(|s| (panel.value)(s).map(|v| (s.t, v)))
                .collect();
            chart
                .draw_series(LineSeries::new(
                    pts,
                    ShapeStyle::from(color).stroke_width(2),
                ))
                .map_err(err)?;
        }
    }
    Ok(())
}
