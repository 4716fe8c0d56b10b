//! Helpers shared by the end-to-end tests that run the default GRPO graph through the `flowrl`
//! binary (main_job_grpo.rs, scale_out.rs).

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;

use serde_json::Value;

/// The `flowrl` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
/// The default graph.
pub const GRAPH: &str = "graphs/grpo_vlm.toml";

/// The repository root (graphs and assets are relative to it).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Small, fast settings of the default graph (same code paths): 4 prompts × n 4, two
/// mini-batches of 8 responses, micro-batches of 4.
pub const SMALL: &[&str] = &[
    "--set",
    "nodes.data.batch_size=4",
    "--set",
    "nodes.rollout.n=4",
    "--set",
    "nodes.update.mini_batch_size=2",
    "--set",
    "nodes.update.micro_batch_size=4",
];

/// A run directory's metrics.jsonl without the wall-clock entries (timings, throughput).
pub fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            let map = v.as_object_mut().unwrap();
            map.retain(|k, _| !k.starts_with("timing_s/") && !k.starts_with("perf/"));
            v
        })
        .collect()
}
