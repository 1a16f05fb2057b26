//! `simulate --svg`: a one-page picture of a simulated plan, written as
//! plain SVG. Top: a Gantt chart of the busiest GPUs and NICs (one bar per
//! transfer, translucent, so overlapping transfers darken). Bottom: the
//! utilisation of the busiest links over time as a heatmap.

use std::fmt::Write;

use switchyard::compiler::report::Report;
use switchyard::compiler::sim::SimResult;
use switchyard::compiler::timeline::{busiest_tracks, link_utilisation, track_name, tracks, Track};
use switchyard::compiler::{Plan, Topology};

/// Rows of the Gantt chart and of the heatmap.
const TRACKS: usize = 16;
const LINKS: usize = 16;
/// Time slices of the heatmap.
const BINS: usize = 120;

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 230.0;
const RIGHT: f64 = 40.0;
const GANTT_ROW: f64 = 20.0;
const HEAT_ROW: f64 = 16.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step for an axis of `span` units: 1, 2 or 5 times a power of ten.
fn tick_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 8.0;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * p)
}

/// White to dark red through yellow, for a utilisation in 0..=1.
fn heat(u: f64) -> String {
    let u = u.clamp(0.0, 1.0);
    let (r, g, b) = if u < 0.5 {
        let k = u / 0.5;
        (255.0, 255.0 - 55.0 * k, 255.0 - 205.0 * k)
    } else {
        let k = (u - 0.5) / 0.5;
        (255.0 - 115.0 * k, 200.0 - 200.0 * k, 50.0 - 50.0 * k)
    };
    format!("rgb({:.0},{:.0},{:.0})", r, g, b)
}

/// Draws a time axis under a panel whose plot area starts at `y0` and is
/// `h` tall.
fn axis(out: &mut String, y0: f64, h: f64, total_us: f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let y = y0 + h;
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="black"/>"#,
        WIDTH - RIGHT
    );
    let step = tick_step(total_us);
    let mut t = 0.0;
    while t <= total_us * 1.000001 {
        let x = LEFT + plot_w * t / total_us.max(f64::MIN_POSITIVE);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            y + 4.0,
            y + 16.0,
            fmt_us(t)
        );
        t += step;
    }
}

fn fmt_us(t: f64) -> String {
    if t == t.round() {
        format!("{t:.0}")
    } else {
        format!("{t}")
    }
}

/// The picture of `plan` simulated as `sim`.
pub fn render(topo: &Topology, plan: &Plan, sim: &SimResult, report: &Report) -> String {
    let total = sim.completion_us.max(f64::MIN_POSITIVE);
    let plot_w = WIDTH - LEFT - RIGHT;
    let x_of = |t: f64| LEFT + plot_w * (t / total).clamp(0.0, 1.0);
    // The busiest NICs and the busiest GPUs, half the rows each when both
    // have that many (NICs first: on most plans they are the bottleneck).
    let busy = busiest_tracks(topo, plan, sim);
    let (nics, gpus): (Vec<_>, Vec<_>) = busy
        .into_iter()
        .partition(|(t, _)| matches!(t, Track::Nic(_)));
    let gpu_rows = gpus.len().min(TRACKS - nics.len().min(TRACKS / 2));
    let mut shown: Vec<(Track, f64)> = nics.into_iter().take(TRACKS - gpu_rows).collect();
    shown.extend(gpus.into_iter().take(gpu_rows));
    let track_of = tracks(topo, plan);
    let usage = link_utilisation(topo, plan, sim, BINS);
    let mut links: Vec<(usize, f64)> = sim
        .links
        .iter()
        .enumerate()
        .filter(|(_, u)| u.bytes > 0.0)
        .map(|(l, _)| (l, sim.utilisation(l as u32)))
        .collect();
    links.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    links.truncate(LINKS);

    let gantt_y = 70.0;
    let gantt_h = GANTT_ROW * shown.len().max(1) as f64;
    let heat_y = gantt_y + gantt_h + 80.0;
    let heat_h = HEAT_ROW * links.len().max(1) as f64;
    let height = heat_y + heat_h + 70.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="24" font-size="16">{}</text>"#,
        esc(&format!(
            "{} on {}: {} transfers, simulated {:.1} us ({} network), lower bound {:.1} us, ratio {:.3}",
            report.algorithm,
            report.topology,
            report.transfers,
            report.completion_us,
            report.network,
            report.lower_bound_us,
            report.ratio_to_bound
        ))
    );
    // Gantt chart.
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-size="13">Busiest GPUs and NICs ({} of {} tracks, by busy time); one bar per transfer, darker where they overlap</text>"#,
        gantt_y - 22.0,
        shown.len(),
        tracks_count(&track_of)
    );
    let legend = [
        ("rdma", "#1f77b4", "inter-node (on the sending NIC)"),
        (
            "nvlink",
            "#ff7f0e",
            "NVLink / intra-node (on the source GPU)",
        ),
        ("local", "#7f7f7f", "local copy"),
    ];
    let mut lx = LEFT;
    for (_, color, label) in legend {
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{}" width="12" height="10" fill="{color}"/><text x="{}" y="{}" font-size="11">{}</text>"#,
            gantt_y - 14.0,
            lx + 16.0,
            gantt_y - 5.0,
            esc(label)
        );
        lx += 24.0 + 6.5 * label.len() as f64;
    }
    for (row, &(track, busy_us)) in shown.iter().enumerate() {
        let y = gantt_y + row as f64 * GANTT_ROW;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{} · {:.0}% busy</text>"#,
            LEFT - 6.0,
            y + GANTT_ROW * 0.7,
            esc(&track_name(topo, track)),
            100.0 * busy_us / total
        );
        if row % 2 == 1 {
            let _ = writeln!(
                out,
                r##"<rect x="{LEFT}" y="{y}" width="{plot_w}" height="{GANTT_ROW}" fill="#f4f4f4"/>"##
            );
        }
    }
    for (i, t) in plan.transfers.iter().enumerate() {
        let Some(row) = shown.iter().position(|(tr, _)| *tr == track_of[i]) else {
            continue;
        };
        let time = sim.transfers[i];
        let color = match track_of[i] {
            Track::Nic(_) => "#1f77b4",
            Track::Gpu(_) if t.src == t.dst => "#7f7f7f",
            Track::Gpu(_) => "#ff7f0e",
        };
        let (x0, x1) = (x_of(time.start_us), x_of(time.end_us));
        let y = gantt_y + row as f64 * GANTT_ROW + 2.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.2}" y="{y}" width="{:.2}" height="{}" fill="{color}" fill-opacity="0.3"/>"#,
            (x1 - x0).max(0.5),
            GANTT_ROW - 4.0
        );
    }
    axis(&mut out, gantt_y, gantt_h, total);
    // Heatmap.
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-size="13">Link utilisation over time ({} busiest of {} links; each transfer counted at its average rate)</text>"#,
        heat_y - 22.0,
        links.len(),
        topo.num_links()
    );
    let scale_x = WIDTH - RIGHT - 340.0;
    for k in 0..=10 {
        let u = k as f64 / 10.0;
        let x = scale_x + 20.0 * k as f64;
        let _ = writeln!(
            out,
            r##"<rect x="{x}" y="{}" width="20" height="10" fill="{}" stroke="#999" stroke-width="0.3"/>"##,
            heat_y - 16.0,
            heat(u)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="end">0%</text><text x="{}" y="{}" font-size="11">100% of capacity</text>"#,
        scale_x - 4.0,
        heat_y - 7.0,
        scale_x + 224.0,
        heat_y - 7.0
    );
    let cell_w = plot_w / BINS as f64;
    for (row, &(l, mean)) in links.iter().enumerate() {
        let y = heat_y + row as f64 * HEAT_ROW;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{} · {:.0}% mean</text>"#,
            LEFT - 6.0,
            y + HEAT_ROW * 0.75,
            esc(&topo.link_name(l as u32)),
            100.0 * mean
        );
        for (b, &u) in usage[l].iter().enumerate() {
            if u <= 0.0 {
                continue;
            }
            let _ = writeln!(
                out,
                r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="{HEAT_ROW}" fill="{}"/>"#,
                LEFT + b as f64 * cell_w,
                cell_w + 0.3,
                heat(u)
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{heat_y}" width="{plot_w}" height="{heat_h}" fill="none" stroke="#999"/>"##
    );
    axis(&mut out, heat_y, heat_h, total);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">time (us, simulated)</text>"#,
        LEFT + plot_w / 2.0,
        height - 14.0
    );
    out.push_str("</svg>\n");
    out
}

fn tracks_count(t: &[Track]) -> usize {
    let mut v = t.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_span() {
        assert_eq!(tick_step(1578.7), 200.0);
        assert_eq!(tick_step(8.0), 1.0);
        assert_eq!(tick_step(0.0), 1.0);
        assert_eq!(heat(0.0), "rgb(255,255,255)");
        assert_eq!(heat(1.0), "rgb(140,0,0)");
    }
}
