//! One module per command. Each turns its arguments into library calls and
//! prints the result; none holds domain logic.

pub mod bench;
pub mod compile;
pub mod demo;
pub mod io;
pub mod picture;
pub mod plot;
pub mod progress;
pub mod run;
pub mod simulate;

use std::fmt;
use std::path::Path;

use switchyard::compiler::Error as CompilerError;

/// A command's failure, with the exit code it maps to.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: a file, flag or value the user gave (exit 2).
    Input(String),
    /// A run or a check that failed (exit 1).
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Input(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Input(s) | CliError::Failed(s) => f.write_str(s),
        }
    }
}

impl From<CompilerError> for CliError {
    fn from(e: CompilerError) -> Self {
        if e.is_bad_input() {
            CliError::Input(e.to_string())
        } else {
            CliError::Failed(e.to_string())
        }
    }
}

impl From<switchyard::compiler::InputError> for CliError {
    fn from(e: switchyard::compiler::InputError) -> Self {
        CliError::Input(e.to_string())
    }
}

pub type CliResult = Result<(), CliError>;

/// Fails early, before minutes of work, when `path` cannot be written
/// because its directory does not exist (or is not a directory).
pub fn check_out_dir(path: &Path) -> CliResult {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(CliError::Input(format!(
            "{}: cannot write: {} is not a directory",
            path.display(),
            dir.display()
        )))
    }
}

/// `-` as an output path: standard output.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Writes `text` to `path`, or to stdout when there is no path or it is `-`.
pub fn write_out(path: Option<&Path>, text: &str) -> CliResult {
    match path {
        None => {
            print!("{text}");
            Ok(())
        }
        Some(p) if is_stdout(p) => {
            print!("{text}");
            Ok(())
        }
        Some(p) => std::fs::write(p, text)
            .map_err(|e| CliError::Input(format!("{}: cannot write: {e}", p.display()))),
    }
}
