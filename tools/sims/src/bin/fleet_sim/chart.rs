//! The report's chart: where the leases phase's Redis calls go, by class of
//! subject, against the goal of 0.10 calls per request (an SVG beside the
//! Markdown report).

use std::path::Path;

use plotters::prelude::*;
use rl_sims::kit::chart;

/// Draws one bar per class (its calls per request of all requests) and
/// the goal line, to `path`.
pub fn calls_by_class(path: &Path, rows: &[(String, f64)], goal: f64) -> Result<(), Box<dyn std::error::Error>> {
    let root = chart::canvas(path, (760, 400))?;
    let top = rows.iter().map(|r| r.1).fold(goal, f64::max) * 1.15;
    let labels: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption("Leases phase: Redis calls per request, by class of subject", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..rows.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            let centred = (x - x.floor() - 0.5).abs() < 1e-6;
            if centred {
                labels.get(i).copied().unwrap_or("").to_string()
            } else {
                String::new()
            }
        })
        .y_desc("calls per request (of all requests)")
        .draw()?;
    chart.draw_series(
        rows.iter()
            .enumerate()
            .map(|(i, (_, v))| Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)], BLUE.mix(0.6).filled())),
    )?;
    chart.draw_series(
        rows.iter()
            .enumerate()
            .map(|(i, (_, v))| Text::new(format!("{v:.3}"), (i as f64 + 0.3, v + top * 0.03), ("sans-serif", 13))),
    )?;
    let total: f64 = rows.iter().map(|r| r.1).sum();
    let label = format!("goal: {goal:.2} in all (measured: {total:.3})");
    chart::level(&mut chart, (0.0, rows.len() as f64), goal, RED.stroke_width(2), &label)?;
    chart::legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    root.present()?;
    Ok(())
}
