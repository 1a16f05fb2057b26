//! Switchyard's runtime: executes a [`Plan`](switchyard_compiler::Plan).
//!
//! The CPU backend (always built) is the reference; the CUDA backend sits
//! behind the `cuda` feature. This crate knows plans and buffers, never how a
//! plan was scheduled.
