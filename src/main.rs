//! The `switchyard` binary: parses arguments and calls the libraries. Every
//! error is printed on one line; exit code 2 for bad input, 1 for a failed
//! run or check.

mod cmd;

use std::process::ExitCode;

use clap::error::ErrorKind;
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
    switchyard::restore_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print as clap has them, on stdout.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprintln!("switchyard: error: no command given; `switchyard --help` lists them");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("switchyard: error: {}", one_line(&e.to_string()));
            return ExitCode::from(2);
        }
    };
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

/// Clap's usage error on one line: its message and tips, without the usage
/// block (`--help` shows that). A line ending in `:` runs on into the next.
fn one_line(rendered: &str) -> String {
    let mut out = String::new();
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out.strip_prefix("error: ").unwrap_or(&out).to_string()
}
