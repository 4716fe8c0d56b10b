//! Memory over a long run: resident set size after step 5 and after step 50 of the default GRPO
//! graph (smaller batch), printed as a table. Autodiff graphs must not outlive a step, so the two
//! numbers should be close. Not a timed test: `cargo bench -p flowrl-nodes --bench main_job_rss`.

use std::path::Path;

use flowrl_engine::{Override, Registry, Session, compile};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn main() {
    // Link the built-in kinds (their `inventory` registrations live in flowrl-nodes).
    std::hint::black_box(flowrl_nodes::resources::model::ModelKind);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::env::set_current_dir(root).unwrap();
    let text = std::fs::read_to_string("graphs/grpo_vlm.toml").unwrap();
    let overrides: Vec<Override> = [
        "run.steps=50",
        "nodes.data.batch_size=8",
        "nodes.rollout.n=4",
        "nodes.update.mini_batch_size=4",
        "nodes.update.micro_batch_size=16",
        "nodes.eval.every=1000",
    ]
    .iter()
    .enumerate()
    .map(|(i, s)| Override::new(format!("bench #{i}"), *s))
    .collect();
    let (graph, _) = match compile(
        &Registry::builtin(),
        "graphs/grpo_vlm.toml",
        &text,
        &overrides,
    ) {
        Ok(g) => g,
        Err(f) => panic!("{}", f.render()),
    };
    let mut session = Session::build(graph, None, None).unwrap();
    let mut at = Vec::new();
    for step in 0..50 {
        session.run_step(step, &mut |_| {}).unwrap();
        if step + 1 == 5 || step + 1 == 50 {
            at.push((step + 1, rss_mib()));
        }
    }
    println!("| after step | RSS (MiB) |");
    println!("|-----------:|----------:|");
    for (s, r) in &at {
        println!("| {s:>10} | {r:>9.1} |");
    }
    println!("growth from step 5 to 50: {:+.1} MiB", at[1].1 - at[0].1);
}
