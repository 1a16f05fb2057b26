//! Typed errors of the compiler crate.
//!
//! Every error a user can cause by what they feed in is an [`InputError`]:
//! it names the file (or source), the place inside it and the reason, so the
//! CLI can print it on one line and exit 2. Everything else (a plan that fails
//! verification, a solver that gives up) has a variant of its own.

use std::fmt;

use thiserror::Error;

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
    /// An algorithm cannot plan one rank's program from that rank's
    /// [`crate::rank::LocalTraffic`]: plan it from the whole matrix
    /// (`Planner::program`) instead.
    #[error("{algorithm}: needs the whole matrix to plan one rank ({reason})")]
    NeedsWholeMatrix { algorithm: String, reason: String },
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

/// The largest input file read when [`MAX_INPUT_ENV`] does not say
/// otherwise: 1 GiB, more than twice a 4096-rank JSON matrix of 20-digit
/// counts (370 MB). Without a bound, `--traffic /dev/zero` read until the
/// host ran out of memory.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;
// 4096 rows of 4096 counts, each up to 20 digits and a separator.
const _: () = assert!(DEFAULT_MAX_INPUT_BYTES > 2 * (4096 * 4096 * 22 + 4096 * 4));

/// The environment variable that overrides [`DEFAULT_MAX_INPUT_BYTES`]
/// (a plain decimal byte count, at least 1).
pub const MAX_INPUT_ENV: &str = "SWITCHYARD_MAX_INPUT_BYTES";

/// The input size limit: [`MAX_INPUT_ENV`] if set, else the default.
pub fn max_input_bytes() -> Result<u64, InputError> {
    let Some(v) = std::env::var_os(MAX_INPUT_ENV) else {
        return Ok(DEFAULT_MAX_INPUT_BYTES);
    };
    let digits = v.to_str().filter(|s| s.bytes().all(|b| b.is_ascii_digit()));
    match digits.and_then(|s| s.parse::<u64>().ok()) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(InputError::new(
            MAX_INPUT_ENV,
            format!(
                "`{}` is not a byte count (a plain decimal number, at least 1)",
                clip(&v.to_string_lossy())
            ),
        )),
    }
}

/// Reads a whole file of UTF-8 text, turning a missing, unreadable,
/// oversized or non-UTF-8 file into an input error. At most
/// [`max_input_bytes`] are read, whatever the file claims to be (so
/// `/dev/zero` is refused, not read forever).
pub fn read_file(path: &std::path::Path) -> Result<String> {
    read_file_within(path, max_input_bytes()?)
}

/// [`read_file`] with the limit given.
fn read_file_within(path: &std::path::Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let file = path.display().to_string();
    let io_error = |e: std::io::Error| {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            _ => e.to_string(),
        };
        Error::Input(InputError::new(&file, reason))
    };
    let f = std::fs::File::open(path).map_err(io_error)?;
    // A regular file's size is a hint for the buffer, never a bound.
    let hint = f.metadata().map_or(0, |m| m.len()).min(limit);
    let mut bytes = Vec::with_capacity(hint as usize + 1);
    f.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::new(
            file,
            format!(
                "larger than {limit} bytes, the most an input file may hold (set {MAX_INPUT_ENV} to raise it)"
            ),
        )
        .into());
    }
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
        InputError::at(
            file,
            format!("line {line}, byte offset {at}"),
            format!("not UTF-8 text (byte 0x{:02x})", bytes[at]),
        )
        .into()
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

/// Why a plan is not a correct all-to-all.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    #[error("plan is for {plan} ranks but the traffic has {traffic}")]
    Ranks { plan: usize, traffic: usize },
    #[error("transfer {index}: {reason}")]
    Transfer { index: usize, reason: String },
    #[error("dependency cycle through transfers {}", fmt_cycle(.cycle))]
    Cycle { cycle: Vec<usize> },
    #[error("transfer {reader} reads bytes {start}..{end} of {buffer} of rank {rank} {why}")]
    ReadBeforeWrite {
        reader: usize,
        rank: usize,
        buffer: &'static str,
        start: u64,
        end: u64,
        why: String,
    },
    #[error(
        "transfers {first} and {second} both write bytes {start}..{end} of {buffer} of rank {rank}"
    )]
    DoubleWrite {
        first: usize,
        second: usize,
        rank: usize,
        buffer: &'static str,
        start: u64,
        end: u64,
    },
    #[error(
        "bytes {start}..{end} of output of rank {rank} (data from rank {src}) are never written"
    )]
    Missing {
        rank: usize,
        src: usize,
        start: u64,
        end: u64,
    },
    #[error(
        "transfer {writer} puts input bytes {origin_start}..{} of rank {origin_rank} at output bytes {start}..{end} of rank {rank}, where input bytes {expected_start}.. of rank {expected_rank} belong",
        origin_start + (end - start)
    )]
    Misplaced {
        writer: usize,
        rank: usize,
        start: u64,
        end: u64,
        origin_rank: usize,
        origin_start: u64,
        expected_rank: usize,
        expected_start: u64,
    },
    /// A well-formed MSCCL XML file that is not a correct all-to-all: its run
    /// deadlocks or reads a chunk nobody wrote, or an output chunk is never
    /// written or gets another chunk. Found by the symbolic executor, which
    /// names the file's line.
    #[error("{file}: line {line}: {reason}")]
    Xml {
        file: String,
        line: usize,
        reason: String,
    },
}

fn fmt_cycle(c: &[usize]) -> String {
    let parts: Vec<String> = c.iter().map(usize::to_string).collect();
    parts.join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_within_a_limit_and_names_bad_bytes() {
        let dir = std::env::temp_dir().join(format!("switchyard-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.json");
        std::fs::write(&p, b"[1,\n 2\xff]").unwrap();
        let e = read_file_within(&p, 100).unwrap_err().to_string();
        assert!(
            e.ends_with("m.json: line 2, byte offset 6: not UTF-8 text (byte 0xff)"),
            "{e}"
        );
        std::fs::write(&p, "[1, 2]").unwrap();
        assert_eq!(read_file_within(&p, 6).unwrap(), "[1, 2]");
        let e = read_file_within(&p, 5).unwrap_err().to_string();
        assert!(e.contains("larger than 5 bytes"), "{e}");
        // A device that never ends is refused once past the limit.
        let zero = std::path::Path::new("/dev/zero");
        if zero.exists() {
            let e = read_file_within(zero, 1 << 16).unwrap_err();
            assert!(e.is_bad_input() && e.to_string().contains("larger than 65536"));
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
