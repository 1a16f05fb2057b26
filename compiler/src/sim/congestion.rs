//! The `congested` network mode: what a lossless (PFC) RDMA fabric does to
//! many-to-one traffic, on top of the ideal max-min model.
//!
//! Two effects, applied at every rate recompute (docs/cost-model.md gives
//! the formulas and the measurements the parameters come from):
//! - receiver incast: a NIC ingress link fed by more concurrent sending NICs
//!   than `incast_threshold` delivers only `efficiency(k)` of its capacity;
//! - head-of-line blocking: PFC pauses a sender NIC's whole queue, so every
//!   flow leaving a NIC that feeds a congested (incast) NIC is held to the
//!   rate of that NIC's slowest flow into a congested NIC.

use serde::{Deserialize, Serialize};

use super::fair::{Filler, Paths};
use crate::topology::{LinkClass, LinkId, Topology};

/// Parameters of the congested mode.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CongestionModel {
    /// Concurrent sending NICs a NIC ingress absorbs at full line rate.
    pub incast_threshold: u32,
    /// Efficiency lost per sender beyond the threshold (hyperbolic decay).
    pub incast_slope: f64,
    /// Efficiency never falls below this fraction of line rate.
    pub incast_floor: f64,
    /// Apply PFC head-of-line blocking to the sending NICs.
    pub head_of_line: bool,
}

impl Default for CongestionModel {
    /// Calibrated (docs/cost-model.md "Calibration"): healthy clusters lose
    /// nothing measurable with fan-in from 4 to 40 sending NICs per receiving
    /// NIC once goodput is accounted for, so the penalty is small: none up
    /// to 8 senders, then hyperbolic down to 0.9 of capacity (0.97 at the
    /// fan-in of 15 that DeepEP#3 measured at 0.92 of line rate), and no
    /// head-of-line blocking.
    fn default() -> Self {
        CongestionModel {
            incast_threshold: 8,
            incast_slope: 0.005,
            incast_floor: 0.9,
            head_of_line: false,
        }
    }
}

impl CongestionModel {
    /// The `stress` mode's parameters, a labelled assumption: no loss up to
    /// 4 senders, 40% of line rate from 16 senders on (a 16:1 QCN incast
    /// measurement of a single hot receiver), hyperbolic in between, and PFC
    /// head-of-line blocking. The all-to-all measurements contradict it for
    /// uniform traffic; many-to-one bursts are not in the data.
    pub fn stress() -> Self {
        CongestionModel {
            incast_threshold: 4,
            incast_slope: 0.125,
            incast_floor: 0.4,
            head_of_line: true,
        }
    }

    /// Fraction of a NIC ingress's capacity delivered with `fan_in` senders:
    /// 1 up to the threshold, then `max(floor, 1 / (1 + slope * (k - T)))`.
    pub fn efficiency(&self, fan_in: u32) -> f64 {
        if fan_in <= self.incast_threshold {
            return 1.0;
        }
        let excess = (fan_in - self.incast_threshold) as f64;
        (1.0 / (1.0 + self.incast_slope * excess)).max(self.incast_floor)
    }
}

/// NIC links of every transfer (`NONE` when it crosses no NIC).
pub(crate) const NONE: LinkId = LinkId::MAX;

/// Reusable state of the congested rate computation.
#[derive(Debug)]
pub(crate) struct Congestion {
    model: CongestionModel,
    /// Per transfer: the NIC egress and ingress links of its path.
    tx_of: Vec<LinkId>,
    rx_of: Vec<LinkId>,
    /// Per link: the last NIC-ingress count (stamp) that saw this NIC egress.
    mark: Vec<u64>,
    stamp: u64,
    /// Per link: capacities after incast efficiency.
    pub cap: Vec<f64>,
    /// Per link: head-of-line rate of a NIC egress (infinite when free).
    hol: Vec<f64>,
    hol_set: Vec<LinkId>,
    congested: Vec<LinkId>,
    flow_cap: Vec<f64>,
}

impl Congestion {
    pub fn new(model: CongestionModel, topo: &Topology, paths: &Paths, n: usize) -> Self {
        let class = |l: LinkId| topo.link(l).class;
        let mut tx_of = vec![NONE; n];
        let mut rx_of = vec![NONE; n];
        for t in 0..n {
            for &l in paths.of(t as u32) {
                match class(l) {
                    LinkClass::NicTx => tx_of[t] = l,
                    LinkClass::NicRx => rx_of[t] = l,
                    _ => {}
                }
            }
        }
        let links = topo.num_links();
        Congestion {
            model,
            tx_of,
            rx_of,
            mark: vec![0; links],
            stamp: 0,
            cap: (0..links as LinkId)
                .map(|l| topo.link(l).bandwidth)
                .collect(),
            hol: vec![f64::INFINITY; links],
            hol_set: Vec::new(),
            congested: Vec::new(),
            flow_cap: Vec::new(),
        }
    }

    /// Rates of the indexed active flows under incast and head-of-line
    /// blocking; `base` holds the links' nominal capacities.
    pub fn fill(
        &mut self,
        filler: &mut Filler,
        flows: &[u32],
        base: &[f64],
        dead: &[bool],
        rate: &mut Vec<f64>,
    ) {
        self.congested.clear();
        for &l in filler.touched() {
            let on = filler.flows_on(l);
            // Only a NIC ingress link carries flows whose rx is this link.
            if on.is_empty() || self.rx_of[flows[on[0] as usize] as usize] != l {
                self.cap[l as usize] = base[l as usize];
                continue;
            }
            self.stamp += 1;
            let mut fan_in = 0u32;
            for &pos in on {
                if dead[pos as usize] {
                    continue;
                }
                let tx = self.tx_of[flows[pos as usize] as usize];
                if tx != NONE && self.mark[tx as usize] != self.stamp {
                    self.mark[tx as usize] = self.stamp;
                    fan_in += 1;
                }
            }
            let eff = self.model.efficiency(fan_in);
            self.cap[l as usize] = base[l as usize] * eff;
            if eff < 1.0 {
                self.congested.push(l);
            }
        }
        filler.fill(&self.cap, None, dead, rate);
        if !self.model.head_of_line || self.congested.is_empty() {
            return;
        }
        for &l in &self.congested {
            for &pos in filler.flows_on(l) {
                let tx = self.tx_of[flows[pos as usize] as usize];
                if tx == NONE || dead[pos as usize] {
                    continue;
                }
                let h = &mut self.hol[tx as usize];
                if h.is_infinite() {
                    self.hol_set.push(tx);
                }
                *h = h.min(rate[pos as usize]);
            }
        }
        self.flow_cap.clear();
        self.flow_cap.extend(flows.iter().map(|&t| {
            let tx = self.tx_of[t as usize];
            if tx == NONE {
                f64::INFINITY
            } else {
                self.hol[tx as usize]
            }
        }));
        for &tx in &self.hol_set {
            self.hol[tx as usize] = f64::INFINITY;
        }
        self.hol_set.clear();
        filler.fill(&self.cap, Some(&self.flow_cap), dead, rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_falls_with_fan_in() {
        let m = CongestionModel::stress();
        assert_eq!(m.efficiency(1), 1.0);
        assert_eq!(m.efficiency(m.incast_threshold), 1.0);
        let a = m.efficiency(m.incast_threshold + 1);
        let b = m.efficiency(m.incast_threshold + 10);
        assert!(a < 1.0 && b < a, "{a} {b}");
        assert_eq!(m.efficiency(100_000), m.incast_floor);
        // The calibrated default: at most a 10% cut, 3% at fan-in 15.
        let d = CongestionModel::default();
        assert_eq!(d.efficiency(8), 1.0);
        assert!((d.efficiency(15) - 1.0 / 1.035).abs() < 1e-12);
        assert_eq!(d.efficiency(100_000), 0.9);
    }
}
