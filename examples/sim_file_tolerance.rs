//! What the simulator's grouping tolerance costs and changes on the plan an
//! MSCCL file encodes (the plan `compile --report` simulates, calibrated
//! network), issue 22 item 5: seconds, events and completion per tolerance,
//! with arrivals grouped (`SimOptions::group_arrivals`, what `compile`
//! does) and without.
//!
//! cargo run --release --example sim_file_tolerance -- TRAFFIC.json FILE.xml [EPS...]
//! (on DGX-H100 nodes of 8 GPUs, as many as the matrix's ranks need)

use std::time::Instant;

use switchyard::compiler::msccl::parse_xml;
use switchyard::compiler::sim::{simulate, Network, SimOptions};
use switchyard::compiler::{Topology, TrafficMatrix};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    switchyard::restore_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [traffic, file, eps @ ..] = &args[..] else {
        return Err("usage: TRAFFIC.json FILE.xml [EPS...]".into());
    };
    let m = TrafficMatrix::load(std::path::Path::new(traffic))?;
    let topo = Topology::preset("dgx-h100", m.ranks() / 8, None)?;
    let t0 = Instant::now();
    let plan = parse_xml(&std::fs::read_to_string(file)?, file, Some(&m))?;
    println!(
        "{file}: {} transfers, read in {:.2} s",
        plan.transfers.len(),
        t0.elapsed().as_secs_f64()
    );
    let eps: Vec<f64> = if eps.is_empty() {
        vec![0.01, 0.05, 0.2]
    } else {
        eps.iter().map(|e| e.parse()).collect::<Result<_, _>>()?
    };
    for e in eps {
        for group_arrivals in [false, true] {
            if e == 0.0 && group_arrivals {
                continue; // the same run
            }
            let t0 = Instant::now();
            let sim = simulate(
                &topo,
                &plan,
                &SimOptions {
                    tolerance: Some(e),
                    group_arrivals,
                    ..SimOptions::new(Network::Calibrated)
                },
            )?;
            println!(
                "tolerance {e}{}: {:.2} s, {} events, completion {:.1} us",
                if group_arrivals {
                    ", arrivals grouped"
                } else {
                    ""
                },
                t0.elapsed().as_secs_f64(),
                sim.events,
                sim.completion_us
            );
        }
    }
    Ok(())
}
