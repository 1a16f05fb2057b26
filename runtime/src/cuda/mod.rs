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
