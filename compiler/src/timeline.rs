//! A simulated plan as a timeline: which GPU or NIC each transfer occupies
//! and when, written in the Chrome trace event format (Perfetto,
//! chrome://tracing) and binned into link utilisation over time.
//!
//! Owns: the track a transfer is drawn on, the trace JSON, the per-link
//! usage bins. Knows nothing of how the times were computed: it reads a
//! [`SimResult`] (the simulator is the only place bytes become time).

use std::io::Write;

use serde_json::{json, Value};

use crate::plan::Plan;
use crate::sim::SimResult;
use crate::topology::{LinkClass, LinkId, Topology};

/// Where a transfer is drawn: on the NIC it leaves through (inter-node), or
/// on its source GPU (NVLink, a `links` graph, local copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    Gpu(usize),
    /// The link id of the NIC's egress.
    Nic(LinkId),
}

/// The track of every transfer of `plan`, indexed like its transfers.
pub fn tracks(topo: &Topology, plan: &Plan) -> Vec<Track> {
    let mut path = Vec::new();
    plan.transfers
        .iter()
        .map(|t| {
            path.clear();
            topo.path_into(t.src as usize, t.dst as usize, &mut path);
            path.iter()
                .find(|&&l| topo.link(l).class == LinkClass::NicTx)
                .map_or(Track::Gpu(t.src as usize), |&l| Track::Nic(l))
        })
        .collect()
}

/// A track's name: `GPU 3 (node 0)`, `NIC nic0.2`.
pub fn track_name(topo: &Topology, track: Track) -> String {
    match track {
        Track::Gpu(r) => format!("GPU {r} (node {})", topo.node_of(r)),
        Track::Nic(l) => {
            let name = topo.link_name(l);
            let nic = name.split("->").next().unwrap_or(&name).to_string();
            format!("NIC {nic}")
        }
    }
}

/// Splits the transfers of one track into rows whose intervals do not
/// overlap (a trace viewer nests slices on one thread, so overlapping ones
/// must sit on different threads). Greedy: each transfer, in start order,
/// takes the first row free at its start. Returns the row of every index in
/// `members`, in the same order, and the number of rows.
fn rows_of(members: &[usize], sim: &SimResult) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (sim.transfers[members[a]], sim.transfers[members[b]]);
        ta.start_us
            .total_cmp(&tb.start_us)
            .then(ta.end_us.total_cmp(&tb.end_us))
    });
    let mut free_at: Vec<f64> = Vec::new();
    let mut row = vec![0; members.len()];
    for k in order {
        let t = sim.transfers[members[k]];
        let r = match free_at.iter().position(|&f| f <= t.start_us) {
            Some(r) => r,
            None => {
                free_at.push(0.0);
                free_at.len() - 1
            }
        };
        free_at[r] = t.end_us;
        row[k] = r;
    }
    (row, free_at.len())
}

/// Writes the plan's simulated timeline in the Chrome trace event format:
/// one process per GPU and per NIC (named by `process_name` metadata), its
/// threads rows of transfers that do not overlap (`thread_name`), and one
/// complete event (`ph: "X"`, `ts` and `dur` in microseconds) per transfer
/// with its bytes, average rate, step and index in `args`. Events are
/// written one at a time, so a plan of a million transfers needs no more
/// memory than the plan.
pub fn write_chrome_trace(
    out: &mut impl Write,
    topo: &Topology,
    plan: &Plan,
    sim: &SimResult,
    title: &str,
) -> std::io::Result<()> {
    let tracks = tracks(topo, plan);
    let mut ids: Vec<Track> = tracks.clone();
    ids.sort_unstable();
    ids.dedup();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
    for (i, t) in tracks.iter().enumerate() {
        if let Ok(k) = ids.binary_search(t) {
            members[k].push(i);
        }
    }
    let header = json!({
        "title": title,
        "completion_us": sim.completion_us,
        "units": "ts and dur in microseconds; rate_gbps in GB/s (1e9 bytes per second), averaged over the time a transfer moved bytes",
    });
    write!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{header},\"traceEvents\":["
    )?;
    let mut first = true;
    let mut event = |out: &mut dyn Write, e: Value| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",\n")?;
        }
        serde_json::to_writer(&mut *out, &e).map_err(std::io::Error::from)
    };
    for (k, (&track, m)) in ids.iter().zip(&members).enumerate() {
        let pid = k + 1;
        event(
            out,
            json!({
                "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                "args": {"name": track_name(topo, track)}
            }),
        )?;
        // GPUs first, then NICs, each in rank / link order.
        event(
            out,
            json!({
                "ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                "args": {"sort_index": k}
            }),
        )?;
        let (rows, n_rows) = rows_of(m, sim);
        for r in 0..n_rows {
            event(
                out,
                json!({
                    "ph": "M", "name": "thread_name", "pid": pid, "tid": r,
                    "args": {"name": format!("row {r}")}
                }),
            )?;
        }
        for (&i, &r) in m.iter().zip(&rows) {
            let t = &plan.transfers[i];
            let time = sim.transfers[i];
            let kind = match track {
                Track::Nic(_) => "rdma",
                Track::Gpu(_) if t.src == t.dst => "local",
                Track::Gpu(_) => "nvlink",
            };
            event(
                out,
                json!({
                    "ph": "X",
                    "name": format!("{} -> {}", t.src, t.dst),
                    "cat": kind,
                    "pid": pid,
                    "tid": r,
                    "ts": time.start_us,
                    "dur": (time.end_us - time.start_us).max(0.0),
                    "args": {
                        "transfer": i,
                        "bytes": t.bytes,
                        "rate_gbps": sim.average_rate(i, t.bytes).map(|r| r / 1e3),
                        "step": t.step,
                        "src": t.src,
                        "dst": t.dst,
                        "moving_from_us": sim.moving_from_us(i),
                    }
                }),
            )?;
        }
    }
    out.write_all(b"]}\n")
}

/// Bytes each link carried in each of `bins` equal slices of the
/// collective, as a fraction of what the link could carry in that slice.
/// A transfer is counted at its average rate over the time it moved bytes
/// (the simulator's rates change at events; this is their mean per
/// transfer). Indexed `[link][bin]`.
pub fn link_utilisation(
    topo: &Topology,
    plan: &Plan,
    sim: &SimResult,
    bins: usize,
) -> Vec<Vec<f64>> {
    let links = topo.num_links();
    let mut usage = vec![vec![0.0; bins]; links];
    let total = sim.completion_us;
    if bins == 0 || total <= 0.0 {
        return usage;
    }
    let width = total / bins as f64;
    let mut path = Vec::new();
    for (i, t) in plan.transfers.iter().enumerate() {
        let Some(rate) = sim.average_rate(i, t.bytes) else {
            continue;
        };
        let (from, to) = (sim.moving_from_us(i), sim.transfers[i].end_us);
        path.clear();
        topo.path_into(t.src as usize, t.dst as usize, &mut path);
        let first = ((from / width) as usize).min(bins - 1);
        let last = ((to / width) as usize).min(bins - 1);
        for &l in &path {
            for (k, u) in usage[l as usize][first..=last].iter_mut().enumerate() {
                let b = first + k;
                let (lo, hi) = (b as f64 * width, (b + 1) as f64 * width);
                *u += rate * (to.min(hi) - from.max(lo)).max(0.0);
            }
        }
    }
    for (l, row) in usage.iter_mut().enumerate() {
        let cap = sim.bandwidth(l as LinkId) * width;
        for u in row.iter_mut() {
            *u = if cap > 0.0 { *u / cap } else { 0.0 };
        }
    }
    usage
}

/// Busy time of every track (the union of its transfers' intervals), to
/// pick the busiest for a picture. Returns `(track, busy_us)` busiest first.
pub fn busiest_tracks(topo: &Topology, plan: &Plan, sim: &SimResult) -> Vec<(Track, f64)> {
    let tracks = tracks(topo, plan);
    let mut by: std::collections::BTreeMap<Track, Vec<(f64, f64)>> = Default::default();
    for (i, &t) in tracks.iter().enumerate() {
        let time = sim.transfers[i];
        if time.end_us > time.start_us {
            by.entry(t).or_default().push((time.start_us, time.end_us));
        }
    }
    let mut out: Vec<(Track, f64)> = by
        .into_iter()
        .map(|(t, mut iv)| {
            iv.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut busy, mut end) = (0.0, f64::NEG_INFINITY);
            for (s, e) in iv {
                if e > end {
                    busy += e - s.max(end);
                    end = e;
                }
            }
            (t, busy)
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::direct;
    use crate::sim::{simulate, SimOptions};
    use crate::TrafficMatrix;

    fn case() -> (Topology, Plan, SimResult) {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(topo.ranks(), 1 << 20);
        m.set(0, 5, 8 << 20);
        let plan = direct(&topo, &m);
        let sim = simulate(&topo, &plan, &SimOptions::default()).unwrap();
        (topo, plan, sim)
    }

    #[test]
    fn trace_holds_every_transfer_once_without_overlap_on_a_thread() {
        let (topo, plan, sim) = case();
        let mut text = Vec::new();
        write_chrome_trace(&mut text, &topo, &plan, &sim, "t").unwrap();
        let v: Value = serde_json::from_slice(&text).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let mut seen = vec![0; plan.transfers.len()];
        let mut by_thread: std::collections::HashMap<(u64, u64), Vec<(f64, f64)>> =
            Default::default();
        for e in events.iter().filter(|e| e["ph"] == "X") {
            let i = e["args"]["transfer"].as_u64().unwrap() as usize;
            seen[i] += 1;
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            assert!(dur >= 0.0);
            assert_eq!(e["args"]["bytes"], plan.transfers[i].bytes);
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            by_thread.entry(key).or_default().push((ts, ts + dur));
        }
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
        for iv in by_thread.values_mut() {
            iv.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            for w in iv.windows(2) {
                assert!(w[1].0 >= w[0].1, "overlap on one thread: {w:?}");
            }
        }
        // Inter-node transfers are on NIC tracks, the others on GPUs.
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert!(names.iter().any(|n| n.starts_with("NIC ")), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("GPU ")), "{names:?}");
    }

    #[test]
    fn utilisation_bins_add_up_to_the_bytes_carried() {
        let (topo, plan, sim) = case();
        let bins = 40;
        let u = link_utilisation(&topo, &plan, &sim, bins);
        let width = sim.completion_us / bins as f64;
        for (l, row) in u.iter().enumerate() {
            let carried: f64 = row.iter().sum::<f64>() * sim.bandwidth(l as LinkId) * width;
            let want = sim.links[l].bytes;
            assert!(
                (carried - want).abs() <= 1e-6 * want.max(1.0),
                "link {l}: {carried} vs {want}"
            );
        }
    }

    #[test]
    fn busiest_track_is_the_hot_senders_nic() {
        let (topo, plan, sim) = case();
        let busy = busiest_tracks(&topo, &plan, &sim);
        let (top, _) = busy[0];
        // Rank 0 sends 8 MiB to rank 5 (node 1) through its rail NIC.
        assert_eq!(track_name(&topo, top), "NIC nic0.0");
        assert!(busy.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}
