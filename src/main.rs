//! The `switchyard` binary: parses arguments and calls the libraries. Every
//! error is printed on one line; exit code 2 for bad input, 1 for a failed
//! run or check.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "All-to-all schedule compiler for skewed MoE traffic"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile every algorithm for a built-in cluster (4 x DGX-H100, skewed MoE traffic) and compare them.
    Demo(cmd::demo::DemoArgs),
    /// Print a topology file for a preset cluster.
    Topology(cmd::io::TopologyArgs),
    /// Generate a traffic matrix.
    Traffic(cmd::io::TrafficArgs),
    /// Compile a schedule for a topology and a traffic matrix.
    Compile(cmd::compile::CompileArgs),
    /// Check that a plan is a correct all-to-all of a traffic matrix.
    Verify(cmd::compile::VerifyArgs),
    /// Simulate a plan: completion time, lower bound, hottest links.
    Simulate(cmd::simulate::SimulateArgs),
    /// Run the benchmark suite: every algorithm on every cluster and workload, in both network modes.
    Bench(cmd::bench::BenchArgs),
    /// Execute a plan on real buffers (cpu or cuda backend) and check every byte.
    Run(cmd::run::RunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Topology(a) => cmd::io::topology(a),
        Command::Traffic(a) => cmd::io::traffic(a),
        Command::Compile(a) => cmd::compile::compile(a),
        Command::Verify(a) => cmd::compile::verify(a),
        Command::Simulate(a) => cmd::simulate::simulate(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Run(a) => cmd::run::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
