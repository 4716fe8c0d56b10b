//! `flowrl plan` and the memory check of `flowrl validate` / `flowrl run`: the JSON schema on
//! the shipped graphs, a graph that cannot fit refused before anything loads (exit 78, with what
//! to change; `--force` overrides), a plan for a described GPU machine, and the plan and
//! memory metrics a run records.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
const TOO_BIG: &str = "tests/fixtures/plan/full_7b_on_cpu.toml";

fn flowrl(args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every shipped graph plans with every node and resource declared, a peak per device, the
/// host and the process, and FLOPs; the breakdown of a pool adds up to its peak.
#[test]
fn every_shipped_graph_plans_with_every_kind_declared() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut graphs: Vec<_> = std::fs::read_dir(root.join("graphs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    graphs.sort();
    assert!(!graphs.is_empty());
    for g in graphs {
        let name = g.display().to_string();
        let j = json(&flowrl(&["plan", &name, "--json"]));
        assert_eq!(
            j["unknown"].as_array().unwrap().len(),
            0,
            "{name}: {}",
            j["unknown"]
        );
        assert_eq!(
            j["not_sized"].as_array().unwrap().len(),
            0,
            "{name}: {}",
            j["not_sized"]
        );
        for n in j["nodes"].as_array().unwrap() {
            assert_eq!(n["declared"], true, "{name}: {}", n["name"]);
        }
        let cpu = &j["devices"]["cpu:0"];
        let sum: u64 = cpu["breakdown"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(sum, cpu["peak_bytes"].as_u64().unwrap(), "{name}");
        let process = j["process_peak_bytes"].as_u64().unwrap();
        assert!(
            process
                > j["runtime_bytes"].as_u64().unwrap() + cpu["peak_bytes"].as_u64().unwrap() / 2,
            "{name}"
        );
        assert!(j["host"]["peak_bytes"].as_u64().unwrap() > 0, "{name}");
        assert!(j["step_flops"].as_f64().unwrap() > 0.0, "{name}");
        assert!(j["step_seconds_estimate"].as_f64().unwrap() > 0.0, "{name}");
        assert_eq!(j["fits"], true, "{name}");
    }
}

#[test]
fn a_graph_that_cannot_fit_is_refused_before_anything_loads() {
    let started = std::time::Instant::now();
    let out = flowrl(&["validate", TOO_BIG]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    for want in [
        "error: the graph does not fit in memory: process needs",
        "DOES NOT FIT",
        "master weights (8.29 B parameters, f32)",
        "AdamW moments (8.29 B parameters, f32)",
        "What to change:",
        "gradient_checkpointing = true",
        "lora = { rank = 16 }",
        "(`--force` runs it anyway)",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    // Refused from config.json alone: no 33 GB of weights read.
    assert!(started.elapsed().as_secs() < 60);

    let out = flowrl(&["run", TOO_BIG, "--out", "/nonexistent/never-created"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(!Path::new("/nonexistent/never-created").exists());

    let out = flowrl(&["validate", TOO_BIG, "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("running anyway (--force)"));
}

#[test]
fn a_gpu_machine_is_planned_from_its_datasheet() {
    let plan = |zero_stage: &str| {
        json(&flowrl(&[
            "plan",
            TOO_BIG,
            "--json",
            "--gpu",
            "h200",
            "--gpus",
            "2",
            "--set",
            "run.devices=[\"cuda:0\", \"cuda:1\"]",
            "--set",
            "nodes.update.gradient_checkpointing=true",
            "--set",
            "nodes.update.micro_batch_size=2",
            "--set",
            &format!("nodes.update.zero_stage={zero_stage}"),
        ]))
    };
    let j = plan("0");
    for d in ["cuda:0", "cuda:1"] {
        assert_eq!(j["devices"][d]["capacity_bytes"], 141_000_000_000u64, "{d}");
        assert!(
            j["devices"][d]["flops_per_second"]["bf16"]
                .as_f64()
                .unwrap()
                > 9e14
        );
    }
    // Each replica keeps a copy of the model and, at ZeRO stage 0, all the AdamW moments (8
    // bytes per parameter, 61 GB for 7B); stage 2 keeps half of them on each of two GPUs, and
    // (bf16 on a GPU) half of the f32 masters, the rest as bf16, whose view then casts only
    // the replica's half (8 GB less).
    let peak = |j: &serde_json::Value, d: &str| j["devices"][d]["peak_bytes"].as_u64().unwrap();
    let sharded = plan("2");
    for d in ["cuda:0", "cuda:1"] {
        let saved = peak(&j, d) - peak(&sharded, d);
        assert!(
            (35e9..45e9).contains(&(saved as f64)),
            "{d}: stage 2 saves {saved} bytes"
        );
    }
    // 7B full fine-tuning does not fit one 141 GB GPU (gpu_path.md §2.6).
    assert_eq!(j["devices"]["cuda:0"]["fits"], false);
    let out = flowrl(&["plan", TOO_BIG, "--gpu", "b300"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown GPU model; known: h200, h100, a100"));
}

#[test]
fn a_run_records_its_plan_and_logs_memory_and_mfu() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = flowrl(&[
        "run",
        "graphs/grpo_vlm.toml",
        "--steps",
        "1",
        "--progress",
        "quiet",
        "--set",
        "run.checkpoint_every=0",
        "--set",
        "run.plot=false",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("plan.json")).unwrap()).unwrap();
    let predicted = plan["process_peak_bytes"].as_u64().unwrap() as f64;
    let line = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    let m: serde_json::Value = line
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|m| m["step"] == 1)
        .unwrap();
    let gb = (1u64 << 30) as f64;
    let peak = m["perf/max_memory_allocated_gb"].as_f64().unwrap() * gb;
    let used = m["perf/cpu_memory_used_gb"].as_f64().unwrap() * gb;
    assert!(used > 0.0 && used <= peak, "{m}");
    // The first step's resident peak against the plan (the steady peak of later steps is the
    // benchmark's: bench/results/plan.md).
    assert!(
        peak > 0.5 * predicted && peak < 1.5 * predicted,
        "measured {peak}, planned {predicted}"
    );
    let mfu = m["perf/mfu"].as_f64().unwrap();
    assert!(mfu > 0.0 && mfu < 1.0, "{mfu}");
}
