//! Regenerates the checked-in MSCCL plans under `schedules/`:
//!
//! ```text
//! cargo run --example regen_schedules
//! ```
//!
//! The test `tests/msccl_schedules.rs` fails when they are stale.

use std::path::PathBuf;

use switchyard::compiler::msccl::schedules::reference_schedules;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schedules");
    std::fs::create_dir_all(&dir)?;
    for f in reference_schedules()? {
        let path = dir.join(&f.name);
        std::fs::write(&path, &f.text)?;
        println!("wrote {} ({} bytes)", path.display(), f.text.len());
    }
    Ok(())
}
