//! The bench's SVG: completion over the lower bound against MoE skew, one
//! line per algorithm, ideal and calibrated side by side. Each panel's axes
//! fit its own data, and the legend sits in a strip of its own below the
//! panels, where it covers no line.

use std::ops::Range;
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

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 520;
/// Height of the legend strip under the panels.
const LEGEND: u32 = 44;

/// The x range (skews) and the y range (ratios) of a panel: the data plus a
/// margin, the y range always including the bound (1.0).
pub fn ranges(points: &[(f64, f64)]) -> (Range<f64>, Range<f64>) {
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (1.0f64, 1.0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = ((x1 - x0) * 0.05).max(0.05);
    let ypad = ((y1 - y0) * 0.05).max(0.02);
    ((x0 - pad)..(x1 + pad), (y0 - ypad)..(y1 + ypad))
}

/// The points of one algorithm in one mode, by skew.
fn series(sel: &[&Row], alg: Algorithm, congested: bool) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = sel
        .iter()
        .filter(|r| r.algorithm == alg.name())
        .map(|r| {
            let y = if congested {
                r.ratio_calibrated
            } else {
                r.ratio_ideal
            };
            (r.skew.unwrap_or(0.0), y)
        })
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

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
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (charts, legend) = root.split_vertically(HEIGHT - LEGEND);
    let panels = charts.split_evenly((1, 2));
    for (panel, congested) in panels.iter().zip([false, true]) {
        let all: Vec<(f64, f64)> = algs
            .iter()
            .flat_map(|&a| series(&sel, a, congested))
            .collect();
        let (xr, yr) = ranges(&all);
        let title = format!(
            "{cluster}: completion / lower bound ({})",
            if congested { "calibrated" } else { "ideal" }
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(xr, yr)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("MoE expert popularity skew (Zipf s)")
            .y_desc("ratio to bound")
            .draw()?;
        for (i, &alg) in algs.iter().enumerate() {
            let pts = series(&sel, alg, congested);
            let color = COLORS[i % COLORS.len()];
            chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    // The legend: one entry per algorithm, in a row under both panels.
    let step = (WIDTH as i32 - 120) / algs.len().max(1) as i32;
    for (i, alg) in algs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let x = 60 + step * i as i32;
        let y = (LEGEND / 2) as i32;
        legend.draw(&PathElement::new(
            vec![(x, y), (x + 24, y)],
            color.stroke_width(3),
        ))?;
        legend.draw(&Text::new(
            alg.name().to_string(),
            (x + 30, y - 7),
            ("sans-serif", 14),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_fit_the_data_and_the_bound() {
        let (x, y) = ranges(&[(0.5, 3.7), (1.2, 6.8), (0.8, 1.02)]);
        assert!(
            x.start < 0.5 && x.start > 0.4 && x.end > 1.2 && x.end < 1.3,
            "{x:?}"
        );
        assert!(y.start < 1.0 && y.start > 0.6, "{y:?}");
        assert!(y.end > 6.8 && y.end < 7.5, "{y:?}");
        // A panel whose worst line is 1.5x must not stretch to another's 16x.
        let (_, y) = ranges(&[(0.5, 1.2), (1.2, 1.5)]);
        assert!(y.end < 1.7, "{y:?}");
    }

    /// A suite's rows plotted: every legend label lies in the strip below
    /// the panels, under every plotted point (ratios up to 7x, as the full
    /// suite's `direct` reaches).
    #[test]
    fn legend_is_below_every_line() {
        let names = ["direct", "pairwise", "hierarchical", "fast", "spray"];
        let mut rows = Vec::new();
        for (k, name) in names.iter().enumerate() {
            for (j, skew) in [0.0, 0.6, 1.0, 1.4].iter().enumerate() {
                let ratio = 1.0 + (k as f64) * 1.5 * (j as f64 + 1.0) / 4.0;
                rows.push(Row {
                    cluster: "dgx-h100 8x8".into(),
                    workload: format!("moe zipf {skew}"),
                    skew: Some(*skew),
                    algorithm: name.to_string(),
                    ranks: 64,
                    total_bytes: 1 << 30,
                    lower_bound_us: 100.0,
                    ideal_us: 100.0 * ratio,
                    calibrated_us: 120.0 * ratio,
                    ratio_ideal: ratio,
                    ratio_calibrated: ratio * 1.1,
                    speedup_ideal: 1.0,
                    speedup_calibrated: 1.0,
                    lower_bound_calibrated_us: 116.0,
                    speedup_pxn: 0.0,
                    speedup_deepep: 0.0,
                    compile_us: 1.0,
                    steps: 1,
                    transfers: 64,
                });
            }
        }
        let algs: Vec<Algorithm> = ["direct", "pairwise", "hierarchical", "fast", "spray"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let path = std::env::temp_dir().join(format!("sy-plot-{}.svg", std::process::id()));
        ratio_vs_skew(&rows, &algs, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let attr = |tag: &str, name: &str| -> Option<f64> {
            let k = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            tag[k..].split('"').next()?.parse().ok()
        };
        let chart_bottom = (HEIGHT - LEGEND) as f64;
        let mut labels = 0;
        for tag in svg.split('<') {
            if tag.starts_with("circle") {
                assert!(attr(tag, "cy").unwrap() < chart_bottom, "{tag}");
            }
            if tag.starts_with("text") {
                let text = tag.rsplit('>').next().unwrap_or("").trim();
                if algs.iter().any(|a| a.name() == text) {
                    assert!(attr(tag, "y").unwrap() >= chart_bottom, "{tag}");
                    labels += 1;
                }
            }
        }
        assert_eq!(labels, algs.len());
    }

    /// Re-plots the recorded suites' SVGs in docs/ from their JSON rows
    /// (`cargo test --bin switchyard replot_recorded_suites -- --ignored`).
    #[test]
    #[ignore]
    fn replot_recorded_suites() {
        for name in ["bench-quick", "bench-full"] {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/");
            let rows: Vec<Row> = serde_json::from_str(
                &std::fs::read_to_string(format!("{dir}{name}.json")).unwrap(),
            )
            .unwrap();
            let mut algs: Vec<Algorithm> = Vec::new();
            for r in &rows {
                let a: Algorithm = r.algorithm.parse().unwrap();
                if !algs.contains(&a) {
                    algs.push(a);
                }
            }
            ratio_vs_skew(&rows, &algs, Path::new(&format!("{dir}{name}.svg"))).unwrap();
        }
    }
}
