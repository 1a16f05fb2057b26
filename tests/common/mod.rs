//! Helpers shared by the CLI's end-to-end tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the binary; returns (exit code, stdout, stderr). A panic is a bug
/// whatever the exit code.
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("binary runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "panic: {err}");
    (
        out.status.code().expect("exited normally"),
        String::from_utf8_lossy(&out.stdout).to_string(),
        err,
    )
}

/// A path in the repository, as a string for the command line.
pub fn root(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

/// The shared reference data (MSCCL spec and example plans): where
/// `SWITCHYARD_REFDATA` points, else `../shared/refdata` beside the checkout;
/// `None` when neither holds it (the tests that need it then skip).
pub fn refdata_dir() -> Option<PathBuf> {
    std::env::var_os("SWITCHYARD_REFDATA")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/refdata")))
        .filter(|p| p.is_dir())
}

/// A scratch directory for one test: `switchyard-NAME-PID` under the
/// system's temporary directory, empty when made, and removed when it goes
/// out of scope. A test that fails keeps it (the drop runs while
/// panicking), so its files can be read afterwards.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    /// A file in it, as a string for the command line.
    pub fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
