//! NCCL's (and RCCL's) topology XML: the dump `NCCL_TOPO_DUMP_FILE` writes,
//! the hand-written `NCCL_TOPO_FILE` form with only PCI classes, and RCCL's
//! `<system version="2">` with `<xgmi>` rows.
//!
//! The file is read into a small element tree; GPUs are `<gpu>` elements (or,
//! in the PCI-only form, `<pci>` elements of class 0x0302xx), NICs are groups
//! of `<net>` rows (one `<nic>` element and one guid) or, in the PCI-only
//! form, `<pci>` elements of class 0x0200xx/0x0207xx. A GPU's NIC is the one
//! whose element shares the deepest ancestor with the GPU's (same host first).

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::{
    assign_rails, intra, list, ImportOptions, NodeShape, DEFAULT_NIC_GBPS, DEFAULT_NIC_GBPS_A100,
    DEFAULT_NIC_LATENCY_US, DEFAULT_PCIE_GBPS, NVLINK_RATES, XGMI_RATES,
};
use crate::error::{num, InputError, Result};
use crate::topology::{IntraKind, NicSpec};

/// GPUs (and NICs) one node's file may list: NVL576 has 576 GPUs in one
/// NVLink domain; more is no node (and would make the closeness search slow).
pub const MAX_GPUS_PER_NODE: usize = 1024;

/// PCI class of an NVSwitch, as `<nvlink tclass>` names it.
const NVSWITCH_CLASS: &str = "0x068000";

/// NVIDIA PCI device ids whose GPU generation the PCI-only form may state.
const DEVICE_SM: &[(&str, u32)] = &[
    ("0x20b0", 80),  // A100-SXM4-40GB
    ("0x20b2", 80),  // A100-SXM4-80GB
    ("0x2330", 90),  // H100 SXM5 80GB
    ("0x2335", 90),  // H200 SXM 141GB
    ("0x2901", 100), // B200
    ("0x31c2", 103), // GB300
];

struct El {
    name: String,
    attrs: Vec<(String, String)>,
    parent: Option<usize>,
    depth: usize,
    line: usize,
}

impl El {
    fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

struct Tree {
    els: Vec<El>,
}

impl Tree {
    fn ancestors(&self, mut i: usize) -> Vec<usize> {
        let mut out = vec![i];
        while let Some(p) = self.els[i].parent {
            out.push(p);
            i = p;
        }
        out
    }
    /// The `host_hash` of the `<cpu>` above an element ("" when none).
    fn host(&self, i: usize) -> &str {
        self.ancestors(i)
            .into_iter()
            .find(|&a| self.els[a].name == "cpu")
            .and_then(|a| self.els[a].get("host_hash"))
            .unwrap_or("")
    }
    /// For every element, whether it has a child called `name` (one pass).
    fn with_child(&self, name: &str) -> Vec<bool> {
        let mut has = vec![false; self.els.len()];
        for e in &self.els {
            if let (Some(p), true) = (e.parent, e.name == name) {
                has[p] = true;
            }
        }
        has
    }
}

fn line_of(text: &str, pos: usize) -> usize {
    text.as_bytes()[..pos.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn parse(text: &str, file: &str) -> Result<Tree> {
    let mut r = Reader::from_str(text);
    r.config_mut().trim_text(true);
    let mut els: Vec<El> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let element =
        |e: &BytesStart<'_>, parent: Option<usize>, depth: usize, line: usize| -> Result<El> {
            let name = e.name().as_ref().to_string();
            let mut attrs = Vec::new();
            for a in e.attributes() {
                let a = a.map_err(|err| {
                    InputError::at(
                        file,
                        format!("line {line}"),
                        format!("<{name}>: bad attribute: {err}"),
                    )
                })?;
                attrs.push((a.key.as_ref().to_string(), a.value.to_string()));
            }
            Ok(El {
                name,
                attrs,
                parent,
                depth,
                line,
            })
        };
    loop {
        let before = r.buffer_position() as usize;
        let ev = r.read_event().map_err(|e| {
            let pos = r.error_position() as usize;
            let e = e.to_string();
            let reason = if e.contains("end of input") {
                format!("ends inside a tag ({e}): the file is truncated")
            } else {
                format!("not well-formed XML: {e}")
            };
            InputError::at(file, format!("line {}", line_of(text, pos)), reason)
        })?;
        let line = line_of(text, before);
        match ev {
            Event::Eof => break,
            Event::Start(ref e) | Event::Empty(ref e) => {
                let parent = open.last().copied();
                if parent.is_none() && !els.is_empty() {
                    return Err(InputError::at(
                        file,
                        format!("line {line}"),
                        "a second root element after </system>",
                    )
                    .into());
                }
                let el = element(e, parent, open.len(), line)?;
                if parent.is_none() && el.name != "system" {
                    return Err(InputError::at(
                        file,
                        format!("line {line}"),
                        format!(
                            "the root element is <{}>, not <system>: not an NCCL topology (NCCL_TOPO_DUMP_FILE / NCCL_TOPO_FILE XML)",
                            el.name
                        ),
                    )
                    .into());
                }
                els.push(el);
                if matches!(ev, Event::Start(_)) {
                    open.push(els.len() - 1);
                }
            }
            Event::End(_) => {
                open.pop();
            }
            _ => {}
        }
    }
    if let Some(&i) = open.last() {
        return Err(InputError::new(
            file,
            format!(
                "ends inside <{}> (line {}): the file is truncated",
                els[i].name, els[i].line
            ),
        )
        .into());
    }
    if els.is_empty() {
        return Err(InputError::new(file, "has no <system> element: not an NCCL topology").into());
    }
    Ok(Tree { els })
}

fn class_is(el: &El, prefixes: &[&str]) -> bool {
    el.name == "pci"
        && el.get("class").is_some_and(|c| {
            prefixes
                .iter()
                .any(|p| c.to_ascii_lowercase().starts_with(p))
        })
}

struct Gpu {
    /// The element NICs are compared against: the GPU's `<pci>`.
    at: usize,
    busid: String,
    gpu_el: Option<usize>,
}

/// A `<gpu>` with its `rank` and `dev`, for ordering.
type Ranked = (Option<u64>, Option<u64>, Gpu);

struct Nic {
    at: usize,
    name: String,
    /// Mb/s per port, and the ports.
    port_mbps: Option<f64>,
    total_mbps: Option<f64>,
    order: (u64, String),
}

fn number(tree: &Tree, el: usize, key: &str, file: &str) -> Result<Option<f64>> {
    let e = &tree.els[el];
    match e.get(key) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
            _ => Err(InputError::at(
                file,
                format!("line {}", e.line),
                format!(
                    "<{}>: {key}=\"{}\" is not a number",
                    e.name,
                    crate::error::clip(v)
                ),
            )
            .into()),
        },
    }
}

/// One node's shape from NCCL or RCCL topology XML.
pub fn read(text: &str, file: &str, opts: &ImportOptions) -> Result<NodeShape> {
    let tree = parse(text, file)?;
    let els = &tree.els;
    let bad = |line: usize, reason: String| -> crate::error::Error {
        InputError::at(file, format!("line {line}"), reason).into()
    };
    let rccl = els[0].get("version") == Some("2") || els.iter().any(|e| e.name == "xgmi");
    let mut assumptions = Vec::new();

    // GPUs: `<gpu>` elements, or PCI class 0x0302 (0x0300) without one.
    let gpu_els: Vec<usize> = (0..els.len()).filter(|&i| els[i].name == "gpu").collect();
    let has_gpu = tree.with_child("gpu");
    let bare: Vec<usize> = (0..els.len())
        .filter(|&i| class_is(&els[i], &["0x0302", "0x0300"]) && !has_gpu[i])
        .collect();
    if !gpu_els.is_empty() && !bare.is_empty() {
        let e = &els[bare[0]];
        return Err(bad(
            e.line,
            format!(
                "<pci busid=\"{}\"> is a GPU (class {}) but has no <gpu> element, while other GPUs have one: the dump is incomplete",
                e.get("busid").unwrap_or("?"),
                e.get("class").unwrap_or("?")
            ),
        ));
    }
    let gpus: Vec<Gpu> = if gpu_els.is_empty() {
        if bare.is_empty() {
            return Err(InputError::new(
                file,
                "has no GPU: no <gpu> element and no <pci> of class 0x0302 (3D controller)",
            )
            .into());
        }
        let mut v: Vec<Gpu> = bare
            .iter()
            .map(|&i| Gpu {
                at: i,
                busid: els[i].get("busid").unwrap_or("").to_ascii_lowercase(),
                gpu_el: None,
            })
            .collect();
        // CUDA numbers devices in PCI bus order by default.
        v.sort_by(|a, b| a.busid.cmp(&b.busid));
        assumptions
            .push("GPUs numbered in PCI bus id order (the file has no <gpu dev rank>)".into());
        v
    } else {
        let mut v: Vec<Ranked> = Vec::new();
        for &i in &gpu_els {
            let at = els[i].parent.unwrap_or(i);
            let rank = number(&tree, i, "rank", file)?.map(|x| x as u64);
            let dev = number(&tree, i, "dev", file)?.map(|x| x as u64);
            v.push((
                rank,
                dev,
                Gpu {
                    at,
                    busid: els[at].get("busid").unwrap_or("").to_ascii_lowercase(),
                    gpu_el: Some(i),
                },
            ));
        }
        let distinct = |key: &dyn Fn(&Ranked) -> Option<u64>| {
            let mut ks: Vec<u64> = v.iter().filter_map(key).collect();
            ks.sort_unstable();
            ks.dedup();
            ks.len() == v.len()
        };
        if distinct(&|g| g.0) {
            v.sort_by_key(|g| g.0);
        } else if distinct(&|g| g.1) {
            v.sort_by_key(|g| g.1);
        }
        v.into_iter().map(|g| g.2).collect()
    };
    let n = gpus.len();
    if n > MAX_GPUS_PER_NODE {
        return Err(InputError::new(
            file,
            format!("has {n} GPUs; one node's file may have at most {MAX_GPUS_PER_NODE}"),
        )
        .into());
    }

    // The generation: `sm` of the <gpu> rows (all the same), or the PCI device id.
    let mut sm: Option<u32> = None;
    let mut gcn: Option<String> = None;
    for g in &gpus {
        if let Some(i) = g.gpu_el {
            if let Some(c) = els[i].get("gcn") {
                gcn = Some(c.to_string());
            } else if let Some(s) = number(&tree, i, "sm", file)? {
                sm = Some(s as u32);
            } else {
                return Err(bad(
                    els[i].line,
                    "<gpu>: no sm attribute (the GPU's compute capability)".into(),
                ));
            }
        } else if let Some(d) = els[g.at].get("device") {
            if let Some(&(_, s)) = DEVICE_SM.iter().find(|(id, _)| id.eq_ignore_ascii_case(d)) {
                sm = Some(s);
            }
        }
    }

    // Links: NVLink or xGMI rows of each GPU.
    let busid_index: std::collections::HashMap<&str, usize> = gpus
        .iter()
        .enumerate()
        .map(|(a, g)| (g.busid.as_str(), a))
        .collect();
    let mut to_switch = vec![0usize; n];
    let mut pair = vec![0usize; n * n];
    let mut any_link = false;
    let gpu_of: std::collections::HashMap<usize, usize> = gpus
        .iter()
        .enumerate()
        .filter_map(|(a, g)| Some((g.gpu_el?, a)))
        .collect();
    for (i, e) in els.iter().enumerate() {
        if !(e.name == "nvlink" || e.name == "xgmi") {
            continue;
        }
        let Some(&a) = e.parent.and_then(|p| gpu_of.get(&p)) else {
            continue;
        };
        {
            any_link = true;
            let count = match number(&tree, i, "count", file)? {
                None => 1,
                Some(c) if (1.0..=1024.0).contains(&c) && c.fract() == 0.0 => c as usize,
                Some(c) => {
                    return Err(bad(
                        e.line,
                        format!(
                            "<{}>: count must be a whole number of links, 1 to 1024, got {}",
                            e.name,
                            num(c)
                        ),
                    ))
                }
            };
            let target = e.get("target").unwrap_or("").to_ascii_lowercase();
            let peer = busid_index.get(target.as_str()).copied();
            match (e.get("tclass"), peer) {
                (Some(NVSWITCH_CLASS), _) | (_, None) => {
                    to_switch[a] = to_switch[a].saturating_add(count)
                }
                (_, Some(b)) => pair[a * n + b] = pair[a * n + b].saturating_add(count),
            }
        }
    }
    let (kind, links) = if to_switch.iter().any(|&c| c > 0) {
        let lo = *to_switch.iter().min().unwrap_or(&0);
        if to_switch.iter().any(|&c| c != lo) {
            assumptions.push(format!(
                "GPUs have {} to {} NVSwitch links; modelled with the fewest, {lo}",
                lo,
                to_switch.iter().max().unwrap_or(&0)
            ));
        }
        (IntraKind::Switch, lo)
    } else if any_link {
        let mut lo = usize::MAX;
        let mut missing = 0;
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    let c = pair[a * n + b];
                    if c == 0 {
                        missing += 1;
                    } else {
                        lo = lo.min(c);
                    }
                }
            }
        }
        if missing > 0 {
            assumptions.push(format!(
                "{missing} ordered GPU pairs have no direct link; modelled as a full mesh of {lo}-link pairs"
            ));
        }
        (IntraKind::Mesh, lo)
    } else {
        (IntraKind::Switch, 0)
    };

    // Rate per link by generation.
    let (gpu_name, intra_gbps) = if let Some(c) = &gcn {
        let Some(&(_, name, rate)) = XGMI_RATES.iter().find(|(g, _, _)| g == c) else {
            let known: Vec<&str> = XGMI_RATES.iter().map(|r| r.0).collect();
            return Err(InputError::new(
                file,
                format!(
                    "<gpu gcn=\"{}\">: unknown AMD GPU, its xGMI link rate is not known (known: {}); give the intra-node bandwidth",
                    crate::error::clip(c),
                    known.join(", ")
                ),
            )
            .into());
        };
        (name.to_string(), rate * links as f64)
    } else {
        let rate = match sm {
            Some(s) => match NVLINK_RATES.iter().find(|r| r.0 == s) {
                Some(&(_, name, rate, default_links)) => Some((name, rate, default_links)),
                None if opts.intra_gbps.is_some() || links == 0 => None,
                None => {
                    let known: Vec<String> = NVLINK_RATES.iter().map(|r| r.0.to_string()).collect();
                    return Err(InputError::new(
                        file,
                        format!(
                            "<gpu sm=\"{s}\">: unknown GPU generation, its NVLink rate is not known (known sm: {}); give the intra-node bandwidth",
                            known.join(", ")
                        ),
                    )
                    .into());
                }
            },
            None => None,
        };
        match (rate, links) {
            (Some((name, r, _)), l @ 1..) => (name.to_string(), r * l as f64),
            (Some((name, r, l)), _) if gpu_els.is_empty() => {
                assumptions.push(format!(
                    "NVLink: the file lists none; assumed NVSwitch with {name}'s {l} links of {} GB/s",
                    num(r)
                ));
                (name.to_string(), r * l as f64)
            }
            (None, 0) if gpu_els.is_empty() => {
                let (_, name, r, l) = NVLINK_RATES[3];
                assumptions.push(format!(
                    "GPU generation not stated (no <gpu sm>, no known PCI device id): assumed {name}, NVSwitch with {l} links of {} GB/s",
                    num(r)
                ));
                ("GPU".to_string(), r * l as f64)
            }
            (rate, 0) => {
                assumptions.push(format!(
                    "no NVLink: GPUs talk over PCIe, assumed {} GB/s per GPU through a switch",
                    num(DEFAULT_PCIE_GBPS)
                ));
                (rate.map_or("GPU", |r| r.0).to_string(), DEFAULT_PCIE_GBPS)
            }
            (None, l) => ("GPU".to_string(), 25.0 * l as f64),
        }
    };
    let intra_gbps = match opts.intra_gbps {
        Some(x) => {
            assumptions.retain(|a| !a.contains("NVLink") && !a.contains("generation"));
            x
        }
        None => intra_gbps,
    };
    if els.iter().any(|e| e.name == "c2c") {
        assumptions.push("<c2c> (GPU-CPU) links ignored: they carry no GPU-to-GPU traffic".into());
    }

    // NICs: groups of <net> rows (one <nic>, one guid), or bare PCI NICs.
    let mut nics: Vec<Nic> = Vec::new();
    let mut groups: Vec<(usize, String, Vec<usize>)> = Vec::new();
    for (i, e) in els.iter().enumerate() {
        if e.name != "net" {
            continue;
        }
        let nic_el = e.parent.unwrap_or(i);
        let key = e
            .get("guid")
            .map_or_else(|| format!("#{i}"), str::to_string);
        match groups.iter_mut().find(|g| g.0 == nic_el && g.1 == key) {
            Some(g) => g.2.push(i),
            None => groups.push((nic_el, key, vec![i])),
        }
    }
    for (nic_el, _, nets) in &groups {
        let mut port = f64::INFINITY;
        let mut total = 0.0;
        let mut order = (u64::MAX, String::new());
        let mut names = Vec::new();
        for &i in nets {
            let e = &els[i];
            let name = e.get("name").unwrap_or("?").to_string();
            let Some(speed) = number(&tree, i, "speed", file)? else {
                return Err(bad(
                    e.line,
                    format!(
                        "<net name=\"{}\"> has no speed (Mb/s)",
                        crate::error::clip(&name)
                    ),
                ));
            };
            if speed <= 0.0 {
                return Err(bad(
                    e.line,
                    format!(
                        "<net name=\"{}\">: speed must be positive, got {}",
                        crate::error::clip(&name),
                        num(speed)
                    ),
                ));
            }
            port = port.min(speed);
            total += speed;
            let dev = number(&tree, i, "dev", file)?.map_or(u64::MAX, |d| d as u64);
            order = order.min((dev, name.clone()));
            names.push(name);
        }
        // Compare against the NIC's PCI device when there is one.
        let at = els[*nic_el].parent.unwrap_or(*nic_el);
        nics.push(Nic {
            at,
            name: names.join("+"),
            port_mbps: Some(port),
            total_mbps: Some(total),
            order,
        });
    }
    let has_nic = tree.with_child("nic");
    for (i, e) in els.iter().enumerate() {
        if class_is(e, &["0x0200", "0x0207"]) && !has_nic[i] {
            nics.push(Nic {
                at: i,
                name: e.get("busid").unwrap_or("?").to_ascii_lowercase(),
                port_mbps: None,
                total_mbps: None,
                order: (u64::MAX, e.get("busid").unwrap_or("").to_ascii_lowercase()),
            });
        }
    }
    if nics.len() > MAX_GPUS_PER_NODE {
        return Err(InputError::new(
            file,
            format!(
                "has {} NICs; one node's file may have at most {MAX_GPUS_PER_NODE}",
                nics.len()
            ),
        )
        .into());
    }
    nics.sort_by(|a, b| a.order.cmp(&b.order));
    // NCCL uses the fastest NICs: slower ports (front-end, management) are left out.
    let fastest = nics
        .iter()
        .filter_map(|k| k.port_mbps)
        .fold(0.0f64, f64::max);
    if fastest > 0.0 {
        let slow: Vec<String> = nics
            .iter()
            .filter(|k| k.port_mbps.is_some_and(|p| p < fastest))
            .map(|k| k.name.clone())
            .collect();
        if !slow.is_empty() {
            assumptions.push(format!(
                "NICs slower than the fastest ({} Mb/s per port) not used: {}",
                num(fastest),
                list(&slow)
            ));
            nics.retain(|k| k.port_mbps.is_none_or(|p| p >= fastest));
        }
    }

    let nic = if nics.is_empty() {
        None
    } else {
        // Closeness: same host first, then the depth of the deepest shared ancestor.
        let anc: Vec<Vec<usize>> = gpus.iter().map(|g| tree.ancestors(g.at)).collect();
        let nic_anc: Vec<Vec<usize>> = nics.iter().map(|k| tree.ancestors(k.at)).collect();
        let (map, kept) = assign_rails(n, nics.len(), |g, k| {
            let same_host = tree.host(gpus[g].at) == tree.host(nics[k].at);
            let shared = anc[g]
                .iter()
                .find(|a| nic_anc[k].contains(a))
                .map_or(0, |&a| els[a].depth);
            (same_host, shared)
        });
        if kept.len() < nics.len() {
            let unused: Vec<String> = (0..nics.len())
                .filter(|k| !kept.contains(k))
                .map(|k| nics[k].name.clone())
                .collect();
            assumptions.push(format!(
                "NICs closest to no GPU not used: {}",
                list(&unused)
            ));
        }
        let kept_nics: Vec<&Nic> = kept.iter().map(|&k| &nics[k]).collect();
        let gbps = match (
            opts.nic_gbps,
            kept_nics
                .iter()
                .filter_map(|k| k.total_mbps)
                .reduce(f64::min),
        ) {
            (Some(x), _) => x,
            (None, Some(mbps)) => {
                let per: Vec<f64> = kept_nics.iter().filter_map(|k| k.total_mbps).collect();
                if per.iter().any(|&x| x != mbps)
                    || kept_nics.iter().any(|k| k.total_mbps.is_none())
                {
                    assumptions.push(format!(
                        "NICs differ in speed; modelled at the slowest, {} Mb/s",
                        num(mbps)
                    ));
                }
                mbps / 8000.0
            }
            (None, None) => {
                let d = if sm == Some(80) {
                    DEFAULT_NIC_GBPS_A100
                } else {
                    DEFAULT_NIC_GBPS
                };
                assumptions.push(format!(
                    "NIC speed not stated (no <net speed>): assumed {} Gb/s ({} GB/s per direction)",
                    num(d * 8.0),
                    num(d)
                ));
                d
            }
        };
        assumptions.push(format!(
            "latencies not stated: {} us per NVLink hop, {} us per NIC",
            num(super::DEFAULT_INTRA_LATENCY_US),
            num(DEFAULT_NIC_LATENCY_US)
        ));
        let names = kept_nics.iter().map(|k| k.name.clone()).collect();
        Some((
            NicSpec {
                per_node: kept.len(),
                bandwidth_gbps: gbps,
                latency_us: DEFAULT_NIC_LATENCY_US,
                gpu_nic: Some(map),
            },
            names,
        ))
    };
    let form = if rccl {
        "RCCL topology"
    } else if gpu_els.is_empty() {
        "NCCL_TOPO_FILE (PCI classes only)"
    } else {
        "NCCL topology dump"
    };
    let (nic, nic_names) = match nic {
        Some((s, names)) => (Some(s), names),
        None => (None, Vec::new()),
    };
    Ok(NodeShape {
        form: form.to_string(),
        gpu_name,
        gpus: n,
        intra: intra(kind, intra_gbps),
        nic,
        nic_names,
        assumptions,
        source: file.to_string(),
    })
}
