//! Line plots written as SVG with plotters (SVG backend only: text is emitted as SVG `<text>`
//! elements, so no system font is read).

use std::path::Path;

use plotters::prelude::*;

use crate::EvalError;

/// Pads a data range so that a flat or single-point series still gets a visible axis.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= f64::EPSILON * lo.abs().max(1.0) {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - d, hi + d);
    }
    (lo - span * 0.05, hi + span * 0.05)
}

/// Writes a line plot of one or more named series to `path` as SVG (800 x 500).
///
/// Non-finite points are not drawn and break the series' line; a series may be empty. Each series gets a colour of
/// plotters' `Palette99`, a line with point markers, and a legend entry.
pub fn plot_lines<S: AsRef<str>>(
    path: impl AsRef<Path>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(S, Vec<(f64, f64)>)],
) -> Result<(), EvalError> {
    let path = path.as_ref();
    let perr = |e: &dyn std::fmt::Display| EvalError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let points = || {
        series
            .iter()
            .flat_map(|(_, pts)| pts.iter().copied().filter(finite))
    };
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (x, y) in points() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let (x0, x1) = padded(x0, x1);
    let (y0, y1) = padded(y0, y1);

    {
        let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| perr(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| perr(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| perr(&e))?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            // A non-finite point breaks the line: each finite run is drawn as its own segment.
            let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
            for p in pts {
                if finite(p) {
                    if let Some(s) = segments.last_mut() {
                        s.push(*p);
                    }
                } else if segments.last().is_some_and(|s| !s.is_empty()) {
                    segments.push(Vec::new());
                }
            }
            for (k, seg) in segments.iter().enumerate() {
                let drawn = chart
                    .draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))
                    .map_err(|e| perr(&e))?;
                if k == 0 {
                    drawn.label(name.as_ref()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                }
            }
            chart
                .draw_series(
                    segments
                        .into_iter()
                        .flatten()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| perr(&e))?;
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(|e| perr(&e))?;
        }
        root.present().map_err(|e| perr(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding() {
        assert_eq!(padded(1.0, 1.0), (0.9, 1.1));
        assert_eq!(padded(0.0, 0.0), (-1.0, 1.0));
        assert_eq!(padded(f64::INFINITY, f64::NEG_INFINITY), (0.0, 1.0));
        let (a, b) = padded(0.0, 10.0);
        assert!((a + 0.5).abs() < 1e-12 && (b - 10.5).abs() < 1e-12);
    }
}
