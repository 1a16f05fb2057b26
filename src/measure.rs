//! `bench --measure-against`: a user's own nccl-tests `alltoall_perf`
//! output beside the cost model's prediction, and calibration parameters
//! fitted to it (docs/cost-model.md "Calibrating to your cluster").

use switchyard_compiler::error::{InputError, Result};
use switchyard_compiler::sched::{schedule, Options};
use switchyard_compiler::sim::{simulate, Calibration, Network, SimOptions};
use switchyard_compiler::topology::LinkClass;
use switchyard_compiler::{Algorithm, Topology, TrafficMatrix};

/// One row of nccl-tests' table: the out-of-place columns (in-place ones
/// are read but not used: all-to-all is out-of-place in the model).
#[derive(Clone, Debug, PartialEq)]
pub struct NcclRow {
    /// Bytes each GPU sends in all (nccl-tests' `size`).
    pub size: u64,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
}

/// Parses nccl-tests' standard table (`size count type redop root` then
/// `time algbw busbw #wrong` out-of-place and in-place). Lines starting with
/// `#` and lines that do not start with a number (banners, warnings) are
/// skipped; a numbered line that is not a full row is an error naming it.
pub fn parse_nccl_tests(text: &str, file: &str) -> Result<Vec<NcclRow>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let Ok(size) = f[0].parse::<u64>() else {
            continue;
        };
        let bad = |why: &str| -> switchyard_compiler::Error {
            InputError::at(file, format!("line {}", i + 1), why.to_string()).into()
        };
        if f.len() < 9 {
            return Err(bad(
                "not a full nccl-tests row (size count type redop root time algbw busbw #wrong ...)",
            ));
        }
        let num = |k: usize, what: &str| -> Result<f64> {
            f[k].parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| bad(&format!("{what} `{}` is not a number", f[k])))
        };
        let row = NcclRow {
            size,
            time_us: num(5, "time")?,
            algbw: num(6, "algbw")?,
            busbw: num(7, "busbw")?,
        };
        if row.size > 0 && row.time_us > 0.0 {
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return Err(
            InputError::at(file, "table", "no nccl-tests rows with a size and a time").into(),
        );
    }
    Ok(rows)
}

/// The model's figures for one measured row.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub row: NcclRow,
    /// Per-pair bytes were rounded down to whole bytes: the modelled size.
    pub model_size: u64,
    pub time_us: f64,
    pub busbw: f64,
}

/// busbw (GB/s) of `bytes` per GPU moved in `time_us` by `ranks` ranks, as
/// nccl-tests reports it for all-to-all.
pub fn busbw(bytes: u64, time_us: f64, ranks: usize) -> f64 {
    bytes as f64 / time_us / 1e3 * (ranks - 1) as f64 / ranks as f64
}

/// Simulated time (us) of a uniform all-to-all of `size` bytes per GPU with
/// `pxn` (NCCL's default PXN, what nccl-tests runs) in `opts`' mode.
pub fn model_time(topo: &Topology, size: u64, opts: &SimOptions) -> Result<(u64, f64)> {
    let r = topo.ranks();
    let per_pair = size / r as u64;
    let traffic = TrafficMatrix::uniform(r, per_pair);
    let plan = schedule(Algorithm::Pxn, topo, &traffic, &Options::default())?;
    let t = simulate(topo, &plan, opts)?.completion_us;
    Ok((per_pair * r as u64, t))
}

/// The model's prediction beside every row, in `opts`' mode.
pub fn predict(topo: &Topology, rows: &[NcclRow], opts: &SimOptions) -> Result<Vec<Prediction>> {
    rows.iter()
        .map(|row| {
            let (model_size, t) = model_time(topo, row.size, opts)?;
            Ok(Prediction {
                row: row.clone(),
                model_size,
                time_us: t,
                busbw: busbw(model_size, t, topo.ranks()),
            })
        })
        .collect()
}

/// Messages the busiest NIC sends in a uniform `pxn` all-to-all.
pub fn messages_per_nic(topo: &Topology) -> Result<usize> {
    let r = topo.ranks();
    let plan = schedule(
        Algorithm::Pxn,
        topo,
        &TrafficMatrix::uniform(r, 1),
        &Options::default(),
    )?;
    let mut count = vec![0usize; topo.num_links()];
    let mut path = Vec::new();
    for t in &plan.transfers {
        path.clear();
        topo.path_into(t.src as usize, t.dst as usize, &mut path);
        if let Some(&l) = path
            .iter()
            .find(|&&l| topo.link(l).class == LinkClass::NicTx)
        {
            count[l as usize] += 1;
        }
    }
    Ok(count.into_iter().max().unwrap_or(0))
}

/// Calibration fitted to measured rows: a least-squares line `time = a +
/// b * size` through them, against the line-rate model's own line. The
/// goodput is the model's bytes-per-us slope over the measured one; the
/// per-message cost is the extra intercept spread over the messages of the
/// busiest NIC. Needs two distinct sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    pub calibration: Calibration,
    /// Measured slope and intercept (us per byte, us).
    pub slope: f64,
    pub intercept: f64,
    pub messages_per_nic: usize,
}

pub fn fit(topo: &Topology, rows: &[NcclRow]) -> Result<Option<Fit>> {
    let n = rows.len() as f64;
    let (mx, my) = (
        rows.iter().map(|r| r.size as f64).sum::<f64>() / n,
        rows.iter().map(|r| r.time_us).sum::<f64>() / n,
    );
    let sxx: f64 = rows.iter().map(|r| (r.size as f64 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return Ok(None);
    }
    let sxy: f64 = rows
        .iter()
        .map(|r| (r.size as f64 - mx) * (r.time_us - my))
        .sum();
    let slope = sxy / sxx;
    if slope <= 0.0 {
        return Ok(None);
    }
    let intercept = my - slope * mx;
    // The line-rate model's own line, from two sizes (it is linear in size).
    let line = SimOptions::uncalibrated(Network::Ideal);
    let r = topo.ranks() as u64;
    let (s1, t1) = model_time(topo, r << 20, &line)?;
    let (s2, t2) = model_time(topo, r << 24, &line)?;
    let m_slope = (t2 - t1) / (s2 - s1) as f64;
    let m_intercept = t1 - m_slope * s1 as f64;
    let messages = messages_per_nic(topo)?;
    let goodput = (m_slope / slope).clamp(0.01, 1.0);
    let per_message = if messages > 0 {
        ((intercept - m_intercept) / messages as f64).max(0.0)
    } else {
        0.0
    };
    Ok(Some(Fit {
        calibration: Calibration {
            nic_goodput: goodput,
            per_message_us: per_message,
        },
        slope,
        intercept,
        messages_per_nic: messages,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_comments_and_errors() {
        let text = "# nThread 1\n#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n\
                    \n     1024   16  float  none  -1  20.5  0.05  0.05  0  20.1  0.05  0.05  N/A\n";
        let rows = parse_nccl_tests(text, "f").unwrap();
        assert_eq!(
            rows,
            vec![NcclRow {
                size: 1024,
                time_us: 20.5,
                algbw: 0.05,
                busbw: 0.05
            }]
        );
        let e = parse_nccl_tests("1024 16 float none -1 x 1 1 0\n", "f").unwrap_err();
        assert_eq!(e.to_string(), "f: line 1: time `x` is not a number");
        let e = parse_nccl_tests("# only comments\n", "f").unwrap_err();
        assert!(e.to_string().contains("no nccl-tests rows"), "{e}");
        assert!(parse_nccl_tests("1024 16 float\n", "f").is_err());
    }

    #[test]
    fn fit_recovers_the_calibration_the_model_ran_with() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let truth = SimOptions {
            calibration: Calibration {
                nic_goodput: 0.8,
                per_message_us: 2.0,
            },
            ..SimOptions::new(Network::Calibrated)
        };
        let rows: Vec<NcclRow> = [1u64 << 22, 1 << 24, 1 << 26]
            .iter()
            .map(|&s| {
                let (size, t) = model_time(&topo, s, &truth).unwrap();
                NcclRow {
                    size,
                    time_us: t,
                    algbw: 0.0,
                    busbw: 0.0,
                }
            })
            .collect();
        let f = fit(&topo, &rows).unwrap().unwrap();
        assert!((f.calibration.nic_goodput - 0.8).abs() < 0.01, "{f:?}");
        assert!((f.calibration.per_message_us - 2.0).abs() < 0.2, "{f:?}");
        // One size: nothing to fit a line to.
        assert!(fit(&topo, &rows[..1]).unwrap().is_none());
    }
}
