//! What the `auto` examples (auto_sweep.rs, auto_batches.rs) share: their
//! flags and their clusters. Included with `#[path]`; not an example itself.

use switchyard::compiler::topology::{FabricSpec, TopologySpec};
use switchyard::compiler::Topology;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The comma-separated values after `flag`, else `default`'s.
pub fn list(args: &[String], flag: &str, default: &str) -> Vec<String> {
    let v = args
        .iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, String::as_str);
    v.split(',').map(str::to_string).collect()
}

/// [`list`], each value parsed.
pub fn parsed<T: std::str::FromStr>(args: &[String], flag: &str, default: &str) -> Res<Vec<T>>
where
    T::Err: std::error::Error + 'static,
{
    list(args, flag, default)
        .iter()
        .map(|s| Ok(s.parse()?))
        .collect()
}

/// The sweep's clusters: full bisection, fat-tree 2:1 (two leaves),
/// rail-optimized 2:1 (one group).
pub fn cluster(preset: &str, nodes: usize, fabric: &str) -> Res<Topology> {
    let mut spec = TopologySpec::preset(preset, nodes, None)?;
    let name = format!("{preset} {nodes}x8 {fabric}");
    spec.fabric = match fabric {
        "full" => None,
        "fat-tree" => Some(FabricSpec::fat_tree((nodes / 2).max(1), 2.0, 1.0)),
        "rail" => Some(FabricSpec::rail_optimized(None, 2.0, 1.0)),
        other => return Err(format!("unknown fabric {other}").into()),
    };
    spec.name = name.clone();
    Ok(Topology::from_spec(spec, &name)?)
}
