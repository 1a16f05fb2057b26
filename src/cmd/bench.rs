//! `bench`: run the suite, print the table, write JSON and an SVG.

use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use switchyard::bench::{median, run_case, suite, Row};
use switchyard::compiler::Algorithm;

use super::{write_out, CliError, CliResult};

#[derive(Args)]
pub struct BenchArgs {
    /// A smaller suite that finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// Write every row as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw ratio to bound against MoE skew per algorithm here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Only these algorithms (comma-separated); `direct`, `pxn` and `deepep` are always run as the references.
    #[arg(long, value_delimiter = ',')]
    algorithms: Vec<String>,
    /// Instead of the suite: nccl-tests `alltoall_perf` output from your
    /// cluster; prints the model's prediction beside each row and fitted
    /// calibration parameters (needs --topology).
    #[arg(long, value_name = "FILE", requires = "topology", conflicts_with_all = ["quick", "json", "svg", "algorithms"])]
    measure_against: Option<PathBuf>,
    /// With --measure-against: the cluster it ran on (topology JSON, or one
    /// node's NCCL XML / `nvidia-smi topo -m` text with --nodes).
    #[arg(long, value_name = "FILE", requires = "measure_against")]
    topology: Option<PathBuf>,
    /// With an imported --topology: the number of nodes.
    #[arg(long, requires = "topology")]
    nodes: Option<usize>,
}

pub fn run(a: BenchArgs) -> CliResult {
    if let (Some(file), Some(topology)) = (&a.measure_against, &a.topology) {
        return measure_against(file, topology, a.nodes);
    }
    let mut algs: Vec<Algorithm> = Algorithm::ALL.to_vec();
    if !a.algorithms.is_empty() {
        algs = a
            .algorithms
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        if !algs.contains(&Algorithm::Direct) {
            algs.insert(0, Algorithm::Direct);
        }
        for base in [Algorithm::Pxn, Algorithm::Deepep] {
            if !algs.contains(&base) {
                algs.push(base);
            }
        }
    }
    for p in a.json.iter().chain(&a.svg) {
        super::check_out_dir(p)?;
    }
    let cases = suite(a.quick)?;
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows: Vec<Row> = Vec::new();
    for case in &cases {
        bar.set_message(format!("{} / {}", case.cluster, case.workload));
        rows.extend(run_case(case, &algs)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    print_table(&rows);
    print_summary(&rows, &algs);
    if let Some(p) = &a.json {
        let text =
            serde_json::to_string_pretty(&rows).map_err(|e| CliError::Failed(e.to_string()))?;
        write_out(Some(p), &(text + "\n"))?;
    }
    if let Some(p) = &a.svg {
        super::plot::ratio_vs_skew(&rows, &algs, p)
            .map_err(|e| CliError::Failed(format!("{}: {e}", p.display())))?;
    }
    Ok(())
}

/// `--measure-against`: measured rows, the calibrated model's prediction,
/// and parameters fitted to the rows.
fn measure_against(file: &Path, topology: &Path, nodes: Option<usize>) -> CliResult {
    use switchyard::compiler::sim::{Network, SimOptions};
    use switchyard::measure::{fit, parse_nccl_tests, predict};
    let text = switchyard::compiler::error::read_file(topology)?;
    let topo =
        super::compile::load_topology_text(&text, &topology.display().to_string(), nodes, None)?;
    let name = file.display().to_string();
    let rows = parse_nccl_tests(&switchyard::compiler::error::read_file(file)?, &name)?;
    let opts = SimOptions::new(Network::Calibrated);
    let c = opts.calibration;
    println!(
        "model: pxn (NCCL's default PXN), uniform traffic, calibrated network (NIC goodput {}, {} us per message) on {} ({} ranks)",
        c.nic_goodput,
        c.per_message_us,
        topo.name(),
        topo.ranks()
    );
    println!(
        "{:>12} {:>12} {:>10} {:>12} {:>10} {:>9}",
        "size (B)", "measured us", "busbw", "model us", "busbw", "model/meas"
    );
    for p in predict(&topo, &rows, &opts)? {
        println!(
            "{:>12} {:>12.1} {:>10.2} {:>12.1} {:>10.2} {:>9.2}",
            p.row.size,
            p.row.time_us,
            p.row.busbw,
            p.time_us,
            p.busbw,
            p.busbw / p.row.busbw.max(f64::MIN_POSITIVE)
        );
    }
    match fit(&topo, &rows)? {
        Some(f) => println!(
            "fitted to {} rows (time = {:.1} us + size / {:.2} GB/s): NIC goodput {:.3}, per-message cost {:.2} us (the busiest NIC sends {} messages): simulate --nic-goodput {:.3} --per-message-us {:.2}",
            rows.len(),
            f.intercept,
            1e-3 / f.slope,
            f.calibration.nic_goodput,
            f.calibration.per_message_us,
            f.messages_per_nic,
            f.calibration.nic_goodput,
            f.calibration.per_message_us
        ),
        None => println!("no fit: it needs rows of at least two sizes whose time grows with size"),
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<28} {:<15} {:<13} {:>8} {:>8} {:>8} {:>8} {:>11} {:>6}",
        "cluster",
        "workload",
        "algorithm",
        "ideal/LB",
        "calib/LB",
        "x direct",
        "x pxn(c)",
        "compile_us",
        "steps"
    );
    for r in rows {
        println!(
            "{:<28} {:<15} {:<13} {:>8.3} {:>8.3} {:>8.2} {:>8.2} {:>11.0} {:>6}",
            r.cluster,
            r.workload,
            r.algorithm,
            r.ratio_ideal,
            r.ratio_calibrated,
            r.speedup_ideal,
            r.speedup_pxn,
            r.compile_us,
            r.steps
        );
    }
}

fn print_summary(rows: &[Row], algs: &[Algorithm]) {
    println!();
    println!("summary over skewed workloads on full-bisection clusters (uniform and oversubscribed fabrics excluded); calib: the calibrated model, against its goodput bound; x pxn / x deepep: speedup over them in the calibrated model:");
    println!(
        "{:<13} {:>12} {:>11} {:>12} {:>11} {:>11} {:>11} {:>13}",
        "algorithm",
        "median ideal",
        "worst ideal",
        "median calib",
        "worst calib",
        "med x pxn",
        "min x pxn",
        "med x deepep"
    );
    for alg in algs {
        let sel: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                r.algorithm == alg.name()
                    && r.workload != "uniform"
                    && !r.cluster.contains("fat-tree")
                    && !r.cluster.contains(" rail ")
            })
            .collect();
        if sel.is_empty() {
            continue;
        }
        let ideal: Vec<f64> = sel.iter().map(|r| r.ratio_ideal).collect();
        let worst = ideal.iter().copied().fold(f64::MIN, f64::max);
        let cal: Vec<f64> = sel.iter().map(|r| r.ratio_calibrated).collect();
        let worst_cal = cal.iter().copied().fold(f64::MIN, f64::max);
        let sp: Vec<f64> = sel.iter().map(|r| r.speedup_pxn).collect();
        let min_sp = sp.iter().copied().fold(f64::MAX, f64::min);
        let dp: Vec<f64> = sel.iter().map(|r| r.speedup_deepep).collect();
        println!(
            "{:<13} {:>12.3} {:>11.3} {:>12.3} {:>11.3} {:>11.2} {:>11.2} {:>13.2}",
            alg.name(),
            median(ideal),
            worst,
            median(cal),
            worst_cal,
            median(sp),
            min_sp,
            median(dp)
        );
    }
}
