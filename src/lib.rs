//! Switchyard's facade: the compiler and runtime crates under one name, and
//! the benchmark suite the CLI's `bench` runs, and `bench --measure-against`'s
//! comparison with nccl-tests output.

pub mod bench;
pub mod measure;

pub use switchyard_compiler as compiler;
pub use switchyard_runtime as runtime;

/// Restores the default action of SIGPIPE, so that a program piped into
/// `head` ends quietly, as other command-line tools do, when the reader goes
/// away. Rust ignores SIGPIPE, so `println!` on the closed pipe panicked with
/// a backtrace; the default action ends the process instead (exit status 141
/// in a shell). The CLI and the examples call it first thing in `main`.
pub fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with SIG_DFL installs no handler of ours; callers do
    // it first thing in `main`, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
