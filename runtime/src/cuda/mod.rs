//! The CUDA backend.
//!
//! Two ways to run, chosen by the environment:
//! - one process for every rank (no `WORLD_SIZE`, or `WORLD_SIZE=1`): rank `r`
//!   lives on device `r % devices`; every transfer is a device copy issued on
//!   a stream of its source rank (one stream per channel, events for
//!   dependencies): `cuMemcpyPeerAsync` between devices (NVLink with peer access
//!   enabled), `cuMemcpyDtoDAsync` on one device. RDMA transfers become device
//!   copies too here: one process has no network to cross. This is the mode
//!   of `runtime/gpu-check.sh`, which maps every rank onto one GPU.
//! - one process per GPU (torchrun-style `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `MASTER_ADDR`, `MASTER_PORT`; `WORLD_SIZE` equal to the plan's ranks):
//!   NCCL send/recv between ranks, one NCCL group per level, local copies on
//!   the same stream; NCCL picks NVLink/P2P inside a node and IB/RoCE between
//!   nodes. The NCCL id travels over TCP ([`bootstrap`]).
//!
//! The device-free parts ([`schedule`], [`bootstrap`]) are always built and
//! tested; the code that talks to the driver needs the `cuda` feature.

pub mod bootstrap;
pub mod schedule;
pub mod watchdog;

#[cfg(feature = "cuda")]
mod device;

use switchyard_compiler::{Plan, TrafficMatrix};

use crate::{Backend, BackendKind, RunOptions, RunReport, RuntimeError};

/// The CUDA backend (stateless; contexts live for one run).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend;

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn run(
        &mut self,
        plan: &Plan,
        traffic: &TrafficMatrix,
        opts: &RunOptions,
    ) -> Result<RunReport, RuntimeError> {
        #[cfg(feature = "cuda")]
        {
            device::run(plan, traffic, opts)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (plan, traffic, opts);
            Err(not_built())
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn not_built() -> RuntimeError {
    RuntimeError::Unavailable(
        "the CUDA backend is not built into this binary (rebuild with `--features cuda`)".into(),
    )
}

/// How many devices a single-process run opens: every visible one, or
/// `--devices` (`requested`, 0 = all), but never more than there are ranks
/// (a device without a rank would only cost a context and peer mappings).
pub fn devices_to_open(visible: usize, requested: usize, ranks: usize) -> usize {
    let want = if requested == 0 {
        visible
    } else {
        requested.min(visible)
    };
    want.min(ranks).max(1)
}

/// The oldest NCCL a process group runs with: 2.14 brought non-blocking
/// communicators (`ncclCommInitRankConfig` with `blocking = 0`) and
/// `ncclCommFinalize`, which every wait here relies on to keep a deadline.
pub const NCCL_MIN: (i32, i32) = (2, 14);

/// `(major, minor, patch)` of an `ncclGetVersion` code (`NCCL_VERSION`:
/// `X*1000 + Y*100 + Z` up to 2.8, `X*10000 + Y*100 + Z` after).
pub fn nccl_version(code: i32) -> (i32, i32, i32) {
    if code >= 10000 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    }
}

/// The value of `CUDA_VISIBLE_DEVICES` for messages: `unset` when it is.
pub fn visible_devices_var() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
}

/// Rate of one plain device-to-device copy of `bytes` on device 0, in GB/s
/// (the reference the GPU check prints next to a plan's copy rate).
pub fn device_copy_rate(bytes: u64) -> Result<f64, RuntimeError> {
    #[cfg(feature = "cuda")]
    {
        device::copy_rate(bytes)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = bytes;
        Err(not_built())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_devices_that_get_a_rank_are_opened() {
        assert_eq!(devices_to_open(8, 0, 16), 8);
        assert_eq!(devices_to_open(8, 0, 2), 2);
        assert_eq!(devices_to_open(8, 4, 16), 4);
        assert_eq!(devices_to_open(2, 4, 16), 2);
        assert_eq!(devices_to_open(8, 3, 1), 1);
        assert_eq!(devices_to_open(1, 0, 0), 1);
    }

    #[test]
    fn nccl_versions_decode() {
        assert_eq!(nccl_version(22803), (2, 28, 3));
        assert_eq!(nccl_version(21400), (2, 14, 0));
        assert_eq!(nccl_version(2804), (2, 8, 4));
        assert!(nccl_version(21305) < (NCCL_MIN.0, NCCL_MIN.1, 0));
        assert!(nccl_version(21400) >= (NCCL_MIN.0, NCCL_MIN.1, 0));
    }
}
