//! The charts' common parts (plotters, SVG): a white canvas, a labelled
//! line, a level across the chart, the legend. What each chart shows
//! stays with its simulation.

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// A chart of `f64` on `f64`, linear or not on either axis.
pub type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// A white SVG canvas of `size` pixels at `path`.
pub fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<SVGBackend<'_>, Shift>, Box<dyn Error>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// `points` joined by a line of `style`; in the legend as `label`, unless
/// it is empty.
pub fn line<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    points: Vec<(f64, f64)>,
    style: impl Into<ShapeStyle>,
    label: &str,
) -> Result<(), Box<dyn Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = style.into();
    let series = chart.draw_series(LineSeries::new(points, style))?;
    if !label.is_empty() {
        series.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    Ok(())
}

/// A level across the chart from `x.0` to `x.1` at `y`: a limit, a goal.
pub fn level<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    x: (f64, f64),
    y: f64,
    style: impl Into<ShapeStyle>,
    label: &str,
) -> Result<(), Box<dyn Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    line(chart, vec![(x.0, y), (x.1, y)], style, label)
}

/// The legend at `position`, on white, with a black border.
pub fn legend<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    position: SeriesLabelPosition,
) -> Result<(), Box<dyn Error>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart.configure_series_labels().position(position).background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}
