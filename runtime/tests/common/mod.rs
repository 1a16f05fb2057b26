//! Random small plans shared by the backend tests: every block cut into
//! pieces, some relayed through another rank's scratch, transfers shuffled.

use proptest::prelude::*;
use switchyard_compiler::{Buffer, Layout, Path, Plan, TrafficMatrix, Transfer};

/// A tiny deterministic generator (the plan's shape comes from the seed).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

fn path(src: u32, dst: u32, gpn: u32) -> Path {
    if src == dst {
        Path::Local
    } else if src / gpn == dst / gpn {
        Path::Nvlink
    } else {
        Path::Rdma { nic: src % gpn }
    }
}

#[allow(clippy::too_many_arguments)]
fn transfer(
    src: u32,
    sb: Buffer,
    so: u64,
    dst: u32,
    db: Buffer,
    doff: u64,
    bytes: u64,
    gpn: u32,
    deps: &[u32],
) -> Transfer {
    Transfer {
        src,
        src_buf: sb,
        src_off: so,
        dst,
        dst_buf: db,
        dst_off: doff,
        bytes,
        path: path(src, dst, gpn),
        step: deps.len() as u32,
        deps: deps.iter().copied().collect(),
    }
}

/// A correct plan: every block cut into 1..=3 pieces, about a third of the
/// pieces relayed through another rank's scratch, transfers shuffled.
pub fn random_plan(m: &TrafficMatrix, gpn: u32, seed: u64) -> Plan {
    let n = m.ranks();
    let layout = Layout::new(m);
    let mut rng = Lcg(seed);
    let mut plan = Plan::new("random", n, gpn as usize);
    let mut scratch = vec![0u64; n];
    for s in 0..n {
        for d in 0..n {
            let total = m.get(s, d);
            let mut cuts = vec![0, total];
            for _ in 0..rng.below(3) {
                cuts.push(rng.below(total + 1));
            }
            cuts.sort_unstable();
            for w in cuts.windows(2) {
                let (off, len) = (w[0], w[1] - w[0]);
                let (so, ro) = (
                    layout.send_offset(s, d) + off,
                    layout.recv_offset(s, d) + off,
                );
                let (s32, d32) = (s as u32, d as u32);
                if rng.below(3) == 0 {
                    let r = rng.below(n as u64) as usize;
                    let at = scratch[r];
                    scratch[r] += len;
                    let first = plan.push(transfer(
                        s32,
                        Buffer::Input,
                        so,
                        r as u32,
                        Buffer::Scratch,
                        at,
                        len,
                        gpn,
                        &[],
                    ));
                    plan.push(transfer(
                        r as u32,
                        Buffer::Scratch,
                        at,
                        d32,
                        Buffer::Output,
                        ro,
                        len,
                        gpn,
                        &[first],
                    ));
                } else {
                    plan.push(transfer(
                        s32,
                        Buffer::Input,
                        so,
                        d32,
                        Buffer::Output,
                        ro,
                        len,
                        gpn,
                        &[],
                    ));
                }
            }
        }
    }
    for (r, &b) in scratch.iter().enumerate() {
        if b > 0 {
            plan.need_scratch(r, b);
        }
    }
    // Shuffle, renumbering dependencies.
    let k = plan.transfers.len();
    let mut perm: Vec<usize> = (0..k).collect();
    for i in (1..k).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut new_index = vec![0u32; k];
    for (new, &old) in perm.iter().enumerate() {
        new_index[old] = new as u32;
    }
    let old = std::mem::take(&mut plan.transfers);
    plan.transfers = perm
        .iter()
        .map(|&o| {
            let mut t = old[o].clone();
            t.deps = t.deps.iter().map(|&d| new_index[d as usize]).collect();
            t
        })
        .collect();
    plan
}

pub fn traffic() -> impl Strategy<Value = (TrafficMatrix, u32)> {
    (1usize..=3, 1usize..=3).prop_flat_map(|(nodes, gpn)| {
        let n = nodes * gpn;
        (
            proptest::collection::vec(proptest::collection::vec(0u64..200, n), n),
            Just(gpn as u32),
        )
            .prop_map(|(rows, gpn)| (TrafficMatrix::from_rows(rows), gpn))
    })
}

/// Moves one input-reading transfer of at least 8 bytes (chosen by `pick`)
/// by one byte inside its buffer, so the plan delivers wrong bytes; false
/// when the plan has no such transfer that can move.
pub fn shift_one_read(plan: &mut Plan, m: &TrafficMatrix, pick: u64) -> bool {
    let layout = Layout::new(m);
    let candidates: Vec<usize> = plan
        .transfers
        .iter()
        .enumerate()
        .filter(|(_, t)| t.bytes >= 8 && t.src_buf == Buffer::Input)
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return false;
    }
    let i = candidates[(pick % candidates.len() as u64) as usize];
    let t = &mut plan.transfers[i];
    if t.src_off + t.bytes < layout.input_size(t.src as usize) {
        t.src_off += 1;
    } else if t.src_off > 0 {
        t.src_off -= 1;
    } else {
        return false;
    }
    true
}
