//! `nvidia-smi topo -m` text: a matrix whose header names the GPUs
//! (`GPU0`..) and NICs (`NIC0`.. with a "NIC Legend", or `mlx5_0`.. in older
//! drivers) and whose `GPU<i>` rows give, per column, `X` (self), `NV<n>`
//! (`n` bonded NVLinks) or the PCIe relation `PIX` < `PXB` < `PHB` < `NODE`
//! < `SYS` (`SOC` in old drivers), closest first. It has no speeds.

use super::nccl::MAX_GPUS_PER_NODE;
use super::{
    assign_rails, intra, list, ImportOptions, NodeShape, DEFAULT_NIC_GBPS, DEFAULT_NIC_LATENCY_US,
    DEFAULT_PCIE_GBPS, NVLINK_RATES,
};
use crate::error::{clip, num, InputError, Result};
use crate::topology::{IntraKind, NicSpec};

/// NVLinks a GPU has at most (H100, B200): a GPU whose rows sum to more
/// reaches its peers through NVSwitches, not over links of its own.
const MAX_LINKS_PER_GPU: usize = 18;

enum Cell {
    Own,
    Nv(usize),
    /// PCIe distance: 0 PIX .. 4 SYS.
    Pci(u8),
}

fn cell(s: &str) -> Option<Cell> {
    Some(match s {
        "X" => Cell::Own,
        "PIX" => Cell::Pci(0),
        "PXB" => Cell::Pci(1),
        "PHB" => Cell::Pci(2),
        "NODE" => Cell::Pci(3),
        "SYS" | "SOC" => Cell::Pci(4),
        _ => Cell::Nv(s.strip_prefix("NV")?.parse().ok().filter(|&n| n > 0)?),
    })
}

fn gpu_index(s: &str) -> Option<usize> {
    s.strip_prefix("GPU")?.parse().ok()
}

/// One node's shape from `nvidia-smi topo -m` output.
pub fn read(text: &str, file: &str, opts: &ImportOptions) -> Result<NodeShape> {
    let not_smi = || {
        InputError::new(
            file,
            "is neither NCCL topology XML nor `nvidia-smi topo -m` output: no header line of GPU0, GPU1, ... columns",
        )
    };
    let lines: Vec<&str> = text.lines().collect();
    let (h, header) = lines
        .iter()
        .enumerate()
        .find(|(_, l)| {
            l.split_whitespace()
                .next()
                .is_some_and(|t| gpu_index(t) == Some(0))
                && l.starts_with(char::is_whitespace)
        })
        .ok_or_else(not_smi)?;
    // Columns: device names up to "CPU Affinity" (and what follows it).
    let columns: Vec<&str> = header
        .split_whitespace()
        .take_while(|t| !matches!(*t, "CPU" | "NUMA"))
        .collect();
    let gpus = columns
        .iter()
        .take_while(|c| gpu_index(c).is_some())
        .count();
    for (i, c) in columns.iter().take(gpus).enumerate() {
        if gpu_index(c) != Some(i) {
            return Err(InputError::at(
                file,
                format!("line {}", h + 1),
                format!("column {c}: expected GPU{i}"),
            )
            .into());
        }
    }
    let nic_cols: Vec<&str> = columns[gpus..].to_vec();
    if gpus > MAX_GPUS_PER_NODE || nic_cols.len() > MAX_GPUS_PER_NODE {
        return Err(InputError::at(
            file,
            format!("line {}", h + 1),
            format!(
                "{gpus} GPUs and {} NICs: one node has at most {MAX_GPUS_PER_NODE} of each",
                nic_cols.len()
            ),
        )
        .into());
    }
    let mut rows: Vec<Option<Vec<Cell>>> = (0..gpus).map(|_| None).collect();
    for (n, l) in lines.iter().enumerate().skip(h + 1) {
        let mut t = l.split_whitespace();
        let Some(g) = t.next().and_then(gpu_index) else {
            continue;
        };
        if g >= gpus {
            return Err(InputError::at(
                file,
                format!("line {}", n + 1),
                format!("row GPU{g}, but the header has {gpus} GPUs"),
            )
            .into());
        }
        let mut cells = Vec::with_capacity(columns.len());
        for (c, col) in columns.iter().enumerate() {
            let s = t.next().ok_or_else(|| {
                InputError::at(
                    file,
                    format!("line {}", n + 1),
                    format!("row GPU{g} ends before column {col}"),
                )
            })?;
            let x = cell(s).ok_or_else(|| {
                InputError::at(
                    file,
                    format!("line {}", n + 1),
                    format!("row GPU{g}, column {col}: `{}` is none of X, NV<n>, PIX, PXB, PHB, NODE, SYS", clip(s)),
                )
            })?;
            if matches!(x, Cell::Own) != (c == g) {
                return Err(InputError::at(
                    file,
                    format!("line {}", n + 1),
                    format!("row GPU{g}, column {col}: `{s}`; `X` belongs on the diagonal only"),
                )
                .into());
            }
            cells.push(x);
        }
        rows[g] = Some(cells);
    }
    let rows: Vec<Vec<Cell>> = rows
        .into_iter()
        .enumerate()
        .map(|(g, r)| r.ok_or_else(|| InputError::new(file, format!("has no row for GPU{g}"))))
        .collect::<std::result::Result<_, _>>()?;
    // NIC names from the legend ("  NIC0: mlx5_0").
    let legend = |col: &str| -> String {
        lines
            .iter()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(col)?
                    .strip_prefix(':')
                    .map(|n| n.trim().to_string())
            })
            .unwrap_or_else(|| col.to_string())
    };
    let mut assumptions = vec![
        "GPU generation not stated: NVLink rate assumed 25 GB/s per link per direction (A100/H100)"
            .to_string(),
    ];

    // NVLink: per pair counts.
    let nv = |a: usize, b: usize| match rows[a][b] {
        Cell::Nv(n) => n,
        _ => 0,
    };
    let (_, _, rate, _) = NVLINK_RATES[3];
    let sums: Vec<usize> = (0..gpus)
        .map(|a| (0..gpus).map(|b| nv(a, b)).sum())
        .collect();
    let all_pairs = (0..gpus).all(|a| (0..gpus).all(|b| a == b || nv(a, b) > 0));
    let (kind, gbps) = if sums.iter().all(|&s| s == 0) {
        assumptions = vec![format!(
            "no NVLink: GPUs talk over PCIe, assumed {} GB/s per GPU through a switch",
            num(DEFAULT_PCIE_GBPS)
        )];
        (IntraKind::Switch, DEFAULT_PCIE_GBPS)
    } else if gpus > 2 && sums.iter().any(|&s| s > MAX_LINKS_PER_GPU) {
        // NVSwitch: every pair shows all of a GPU's links.
        let links = (0..gpus)
            .flat_map(|a| (0..gpus).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| nv(a, b))
            .min()
            .unwrap_or(0);
        (IntraKind::Switch, rate * links as f64)
    } else {
        let lo = (0..gpus)
            .flat_map(|a| (0..gpus).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| nv(a, b))
            .filter(|&n| n > 0)
            .min()
            .unwrap_or(0);
        if !all_pairs {
            assumptions.push(format!(
                "some GPU pairs have no NVLink; modelled as a full mesh of NV{lo} pairs"
            ));
        }
        (IntraKind::Mesh, rate * lo as f64)
    };
    let gbps = match opts.intra_gbps {
        Some(x) => {
            assumptions.retain(|a| !a.contains("NVLink"));
            x
        }
        None => gbps,
    };

    let nic = if nic_cols.is_empty() {
        None
    } else {
        let (map, kept) = assign_rails(gpus, nic_cols.len(), |g, k| match rows[g][gpus + k] {
            Cell::Pci(d) => 4 - d,
            _ => 0,
        });
        if kept.len() < nic_cols.len() {
            let unused: Vec<String> = (0..nic_cols.len())
                .filter(|k| !kept.contains(k))
                .map(|k| legend(nic_cols[k]))
                .collect();
            assumptions.push(format!(
                "NICs closest to no GPU not used: {}",
                list(&unused)
            ));
        }
        let bw = match opts.nic_gbps {
            Some(x) => x,
            None => {
                assumptions.push(format!(
                    "NIC speed not stated: assumed {} Gb/s ({} GB/s per direction)",
                    num(DEFAULT_NIC_GBPS * 8.0),
                    num(DEFAULT_NIC_GBPS)
                ));
                DEFAULT_NIC_GBPS
            }
        };
        assumptions.push(format!(
            "latencies not stated: {} us per NVLink hop, {} us per NIC",
            num(super::DEFAULT_INTRA_LATENCY_US),
            num(DEFAULT_NIC_LATENCY_US)
        ));
        Some((
            NicSpec {
                per_node: kept.len(),
                bandwidth_gbps: bw,
                latency_us: DEFAULT_NIC_LATENCY_US,
                gpu_nic: Some(map),
            },
            kept.iter().map(|&k| legend(nic_cols[k])).collect(),
        ))
    };
    let (nic, nic_names) = match nic {
        Some((s, n)) => (Some(s), n),
        None => (None, Vec::new()),
    };
    Ok(NodeShape {
        form: "nvidia-smi topo -m".into(),
        gpu_name: "GPU".into(),
        gpus,
        intra: intra(kind, gbps),
        nic,
        nic_names,
        assumptions,
        source: file.to_string(),
    })
}
