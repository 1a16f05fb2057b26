//! Typed errors of the compiler crate.
//!
//! Every error a user can cause by what they feed in is an [`InputError`]:
//! it names the file (or source), the place inside it and the reason, so the
//! CLI can print it on one line and exit 2. Everything else (a plan that fails
//! verification, a solver that gives up) has a variant of its own.

use std::fmt;

use thiserror::Error;

use crate::verify::VerifyError;

/// Bad input: which file, where in it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// File path or source name (`<preset dgx-h100>`, `<generated>`, …).
    pub file: String,
    /// Where in the file: `line 3, column 7`, `row 2, column 5`, `nic.bandwidth_GBps`.
    pub place: Option<String>,
    /// What is wrong, in words.
    pub reason: String,
}

impl InputError {
    pub fn new(file: impl Into<String>, reason: impl Into<String>) -> Self {
        InputError {
            file: file.into(),
            place: None,
            reason: reason.into(),
        }
    }

    pub fn at(
        file: impl Into<String>,
        place: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        InputError {
            file: file.into(),
            place: Some(place.into()),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.place {
            Some(place) => write!(f, "{}: {}: {}", self.file, place, self.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
        }
    }
}

impl std::error::Error for InputError {}

/// Every error of the compiler crate.
#[derive(Debug, Error)]
pub enum Error {
    /// The user's input is malformed or inconsistent (exit code 2).
    #[error("{0}")]
    Input(#[from] InputError),
    /// A plan is not a correct all-to-all (exit code 1).
    #[error("plan is not a correct all-to-all: {0}")]
    Verify(#[from] VerifyError),
    /// An algorithm cannot schedule this input (for example, `fast` on a
    /// topology given as a raw link list).
    #[error("{algorithm}: {reason}")]
    Unsupported { algorithm: String, reason: String },
    /// The LP solver failed or gave up.
    #[error("solver: {0}")]
    Solver(String),
    /// Reading or writing a file failed for a reason outside its content.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True when the error was caused by what the user fed in, the CLI's exit code 2.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, Error::Input(_) | Error::Io { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// At most 40 characters of a value a user wrote, for a one-line message
/// (a file may hold a megabyte where a number belongs).
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// A number a user wrote, short: `1e300` rather than its 301 digits.
pub fn num(x: f64) -> String {
    if x == 0.0 || (x.abs() >= 1e-6 && x.abs() < 1e15) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// Reads a whole file, turning a missing or unreadable file into an input error.
pub fn read_file(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            std::io::ErrorKind::InvalidData => "not UTF-8 text".to_string(),
            _ => e.to_string(),
        };
        Error::Input(InputError::new(path.display().to_string(), reason))
    })
}

/// JSON and CSV files must not begin with a UTF-8 byte-order mark (as
/// spreadsheets write): without this, the parser's error was "line 1, column
/// 1: expected value" or a first cell that is "not a byte count".
pub fn check_no_bom(text: &str, file: &str) -> Result<(), InputError> {
    if text.starts_with('\u{feff}') {
        return Err(InputError::at(
            file,
            "line 1",
            "begins with a UTF-8 byte-order mark; save the file without one",
        ));
    }
    Ok(())
}

/// Turns a serde_json error into an input error with its line and column.
pub fn json_error(file: &str, e: &serde_json::Error) -> InputError {
    let reason = match e.classify() {
        serde_json::error::Category::Eof => "unexpected end of file (truncated JSON?)".to_string(),
        _ => {
            // serde_json appends " at line L column C"; we print the place separately.
            let msg = e.to_string();
            match msg.rfind(" at line ") {
                Some(i) => msg[..i].to_string(),
                None => msg,
            }
        }
    };
    InputError::at(
        file,
        format!("line {}, column {}", e.line(), e.column()),
        reason,
    )
}
