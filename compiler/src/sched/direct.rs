//! `direct`: every rank sends to every peer at once over its own rail, the
//! schedule NCCL's grouped send/recv produces. The baseline.

pub use crate::plan::path_between;
use crate::plan::{Buffer, Deps, Plan, Transfer};
use crate::topology::Topology;
use crate::traffic::{Layout, TrafficMatrix};

/// One transfer per non-empty block, all in step 0, no dependencies.
pub fn direct(topo: &Topology, traffic: &TrafficMatrix) -> Plan {
    let n = traffic.ranks();
    let layout = Layout::new(traffic);
    let mut plan = Plan::new("direct", n, topo.gpus_per_node());
    plan.transfers.reserve(n * n);
    for s in 0..n {
        for d in 0..n {
            let bytes = traffic.get(s, d);
            if bytes == 0 {
                continue;
            }
            plan.push(block_transfer(topo, &layout, traffic, s, d, 0, Deps::new()));
        }
    }
    plan
}

/// Block `M[s][d]` straight from the input of `s` to its place in the output of `d`.
pub fn block_transfer(
    topo: &Topology,
    layout: &Layout,
    traffic: &TrafficMatrix,
    s: usize,
    d: usize,
    step: u32,
    deps: Deps,
) -> Transfer {
    Transfer {
        src: s as u32,
        src_buf: Buffer::Input,
        src_off: layout.send_offset(s, d),
        dst: d as u32,
        dst_buf: Buffer::Output,
        dst_off: layout.recv_offset(s, d),
        bytes: traffic.get(s, d),
        path: path_between(topo, s, d),
        step,
        deps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_on;

    #[test]
    fn direct_is_verified() {
        let topo = Topology::preset("dgx-h100", 2, Some(4)).unwrap();
        let mut m = TrafficMatrix::uniform(8, 100);
        m.set(3, 5, 0);
        m.set(2, 6, 12345);
        let p = direct(&topo, &m);
        assert_eq!(p.transfers.len(), 63);
        verify_on(&p, &m, &topo).unwrap();
    }
}
