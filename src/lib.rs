//! Switchyard's facade: the compiler and runtime crates under one name, and
//! the benchmark suite the CLI's `bench` runs.

pub mod bench;

pub use switchyard_compiler as compiler;
pub use switchyard_runtime as runtime;
