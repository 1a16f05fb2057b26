//! Reading a topology file of any form: Switchyard's topology JSON, or one
//! node's NCCL/RCCL topology XML or `nvidia-smi topo -m` text, which the
//! import turns into a [`TopologySpec`](crate::topology::TopologySpec) for a
//! cluster of such nodes. These are [`Topology`]'s constructors from text and
//! files; they live here, above the topology model, so that the model knows
//! nothing of the import (data flows one way: import -> topology).

use super::{is_xml, node_count, read_node, ImportOptions};
use crate::error::{check_no_bom, json_error, read_file, InputError, Result};
use crate::topology::{Topology, TopologySpec};

/// True for text the import reads (NCCL/RCCL XML, `nvidia-smi topo -m`)
/// rather than Switchyard's topology JSON.
pub fn is_import(text: &str) -> bool {
    is_xml(text) || is_smi(text)
}

/// True for `nvidia-smi topo -m` text: not JSON, and a header line that
/// starts with blanks and then `GPU0`.
fn is_smi(text: &str) -> bool {
    !text.trim_start().starts_with('{')
        && text.lines().any(|l| {
            l.starts_with(char::is_whitespace) && l.split_whitespace().next() == Some("GPU0")
        })
}

impl Topology {
    /// Reads and validates a topology file: Switchyard's JSON, or one node's
    /// NCCL/RCCL topology XML or `nvidia-smi topo -m` text (one node; see
    /// [`Topology::load_sized`] for more).
    pub fn load(path: &std::path::Path) -> Result<Topology> {
        Ok(Topology::load_sized(path, None, None, &ImportOptions::default())?.0)
    }

    /// Reads a topology file of any form. For an imported node description
    /// the cluster has `nodes` nodes, else `ranks` / GPUs per node, else 1;
    /// the import's assumptions come back in words (none for JSON). For JSON,
    /// `nodes` must match the file.
    pub fn load_sized(
        path: &std::path::Path,
        nodes: Option<usize>,
        ranks: Option<usize>,
        opts: &ImportOptions,
    ) -> Result<(Topology, Vec<String>)> {
        let text = read_file(path)?;
        Topology::from_text(&text, &path.display().to_string(), nodes, ranks, opts)
    }

    /// Parses topology text of any form (see [`Topology::load_sized`]).
    pub fn from_text(
        text: &str,
        file: &str,
        nodes: Option<usize>,
        ranks: Option<usize>,
        opts: &ImportOptions,
    ) -> Result<(Topology, Vec<String>)> {
        check_no_bom(text, file)?;
        if is_import(text) {
            let shape = read_node(text, file, opts)?;
            let mut assumptions = shape.assumptions.clone();
            let n = node_count(&shape, nodes, ranks, &mut assumptions)?;
            let topo = Topology::from_spec(shape.spec(n)?, file)?;
            return Ok((topo, assumptions));
        }
        let topo = Topology::from_json_str(text, file)?;
        if let Some(n) = nodes.filter(|&n| n != topo.nodes()) {
            return Err(InputError::new(
                file,
                format!(
                    "has {} nodes, but {n} were asked for (--nodes applies to an imported node description)",
                    topo.nodes()
                ),
            )
            .into());
        }
        Ok((topo, Vec::new()))
    }

    /// `nodes` nodes as one node's NCCL/RCCL topology XML (or `nvidia-smi
    /// topo -m` text) describes, with the import's assumptions.
    pub fn from_nccl(path: &std::path::Path, nodes: usize) -> Result<(Topology, Vec<String>)> {
        Topology::load_sized(path, Some(nodes), None, &ImportOptions::default())
    }

    /// Parses and validates topology JSON; `file` names it in errors. NCCL
    /// XML and `nvidia-smi topo -m` text are imported as one node.
    pub fn from_json_str(text: &str, file: &str) -> Result<Topology> {
        check_no_bom(text, file)?;
        if is_import(text) {
            return Ok(Topology::from_text(text, file, None, None, &ImportOptions::default())?.0);
        }
        let spec: TopologySpec = serde_json::from_str(text).map_err(|e| json_error(file, &e))?;
        Topology::from_spec(spec, file)
    }
}
