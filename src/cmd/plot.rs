//! The bench's SVG: completion over the lower bound against MoE skew, one
//! line per algorithm, ideal and calibrated side by side.

use std::path::Path;

use plotters::prelude::*;
use switchyard::bench::Row;
use switchyard::compiler::Algorithm;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Plots the MoE rows of the largest full-bisection cluster in `rows`.
pub fn ratio_vs_skew(
    rows: &[Row],
    algs: &[Algorithm],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let moe: Vec<&Row> = rows
        .iter()
        .filter(|r| r.skew.is_some() && !r.cluster.contains("fat-tree"))
        .collect();
    let Some(biggest) = moe
        .iter()
        .filter(|r| r.cluster.starts_with("dgx-h100"))
        .max_by_key(|r| r.ranks)
    else {
        return Err("no MoE rows to plot".into());
    };
    let cluster = biggest.cluster.clone();
    let sel: Vec<&Row> = moe.into_iter().filter(|r| r.cluster == cluster).collect();
    let ymax = sel
        .iter()
        .map(|r| r.ratio_ideal.max(r.ratio_calibrated))
        .fold(1.0, f64::max)
        .min(20.0)
        * 1.05;
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 2));
    for (panel, congested) in panels.iter().zip([false, true]) {
        let title = format!(
            "{cluster}: completion / lower bound ({})",
            if congested { "calibrated" } else { "ideal" }
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0.4f64..1.3f64, 0.9f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("MoE expert popularity skew (Zipf s)")
            .y_desc("ratio to bound")
            .draw()?;
        for (i, alg) in algs.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = sel
                .iter()
                .filter(|r| r.algorithm == alg.name())
                .map(|r| {
                    let y = if congested {
                        r.ratio_calibrated
                    } else {
                        r.ratio_ideal
                    };
                    (r.skew.unwrap_or(0.0), y.min(ymax))
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(alg.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
