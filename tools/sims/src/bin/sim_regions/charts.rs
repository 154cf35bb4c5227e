//! One chart per scenario: admitted per second per region and in total
//! against the global limit, and the shares in force over time.

use std::path::Path;

use plotters::prelude::*;
use rl_sims::kit::chart;

use crate::rules::RATE;
use crate::traffic::{Recording, BUCKET, REGIONS};

const COLORS: [RGBColor; 3] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44)];

/// Per bucket end, the admitted over the last second (a moving sum).
fn per_second(values: &[u64]) -> Vec<(f64, f64)> {
    let b = BUCKET.as_secs_f64();
    let per = (1.0 / b).round() as usize;
    (per..=values.len()).map(|end| (end as f64 * b, values[end - per..end].iter().sum::<u64>() as f64)).collect()
}

pub fn draw(path: &Path, title: &str, rec: &Recording) -> Result<(), Box<dyn std::error::Error>> {
    let root = chart::canvas(path, (900, 620))?;
    let (top, bottom) = root.split_vertically(380);
    let end = rec.busy_admitted.len() as f64 * BUCKET.as_secs_f64();
    let total = per_second(&rec.busy_total());
    let ymax = total.iter().map(|p| p.1).fold(RATE as f64, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&top)
        .caption(format!("{title}: the busy customer's admitted requests"), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..ymax)?;
    chart.configure_mesh().max_light_lines(2).x_desc("seconds").y_desc("admitted in the last 1 s").draw()?;
    for (r, name) in REGIONS.iter().enumerate() {
        let series = per_second(&rec.busy_admitted.iter().map(|b| b[r]).collect::<Vec<_>>());
        chart::line(&mut chart, series, COLORS[r].stroke_width(2), name)?;
    }
    chart::line(&mut chart, total, BLACK.stroke_width(2), "all regions")?;
    chart::level(&mut chart, (0.0, end), RATE as f64, RED.stroke_width(2), &format!("global limit: {RATE}/s"))?;
    for (at, _) in &rec.events {
        chart::line(&mut chart, vec![(*at, 0.0), (*at, ymax)], BLACK.mix(0.3), "")?;
    }
    chart::legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    let mut shares = ChartBuilder::on(&bottom)
        .caption("its share in force at a gateway of each region (%); grey lines: the events", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..100.0)?;
    shares.configure_mesh().max_light_lines(2).x_desc("seconds").y_desc("share %").draw()?;
    for (r, name) in REGIONS.iter().enumerate() {
        // A region without gateways has no line there.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (t, s) in &rec.shares {
            match s[r] {
                Some(v) => runs.last_mut().unwrap().push((*t, v as f64 / 1e4)),
                None if !runs.last().unwrap().is_empty() => runs.push(Vec::new()),
                None => {}
            }
        }
        // The region's name in the legend once, on its first stretch.
        for (i, run) in runs.into_iter().enumerate() {
            chart::line(&mut shares, run, COLORS[r].stroke_width(2), if i == 0 { name } else { "" })?;
        }
    }
    for (at, _) in &rec.events {
        chart::line(&mut shares, vec![(*at, 0.0), (*at, 100.0)], BLACK.mix(0.3), "")?;
    }
    chart::legend(&mut shares, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}
