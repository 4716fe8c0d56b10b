//! The markdown table printed after the records: one row per measurement.

use serde_json::Value;

/// The markdown table of the records.
pub(super) fn markdown(records: &[Value]) -> String {
    let mut md = String::new();
    let f = |v: &Value| match v {
        Value::Null => "–".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for r in records.iter().filter(|r| r["bench"] == "info") {
        md += &format!(
            "bench-gpu-micro on {} ({}), {}; device init {} s; autotune {}; autotune cache {}; compilation cache {}\n\n",
            f(&r["device"]),
            f(&r["runtime"]),
            f(&r["dtype"]),
            f(&r["device_init_s"]),
            f(&r["autotune_level"]),
            f(&r["autotune_cache"]),
            f(&r["compilation_cache"])
        );
    }
    md += "| measurement | value |\n|---|---:|\n";
    for r in records {
        let line = match r["bench"].as_str() {
            Some("launch") => format!(
                "| µs per launch ({} adds, synced; host issue alone {} µs) | {} |",
                f(&r["n"]),
                f(&r["issue_us_per_launch"]),
                f(&r["us_per_launch"])
            ),
            Some("read") => format!(
                "| device → host read, {} ({} MB; ms {}) GB/s | {} |",
                f(&r["label"]),
                f(&r["mb"]),
                f(&r["ms"]),
                f(&r["gb_s"])
            ),
            Some("elementwise") => format!(
                "| elementwise add, {} ({} MB tensors, {} µs) GB/s | {} |",
                f(&r["kind"]),
                f(&r["mb"]),
                f(&r["us"]),
                f(&r["gb_s"])
            ),
            Some("gemm") => format!(
                "| {} GEMM M={} N={} K={} ({}): TFLOP/s (steady {} ms × {}; first call {} s) | {} |",
                f(&r["dtype"]),
                f(&r["m"]),
                f(&r["n"]),
                f(&r["k"]),
                f(&r["what"]),
                f(&r["ms"]),
                f(&r["reps"]),
                f(&r["first_s"]),
                f(&r["tflops"])
            ),
            Some("first_pass") if r["phase"] == "error" => {
                format!("| first pass | error: {} |", f(&r["error"]))
            }
            Some("first_pass") if r["phase"] == "build" => format!(
                "| first pass of {} ({} params, {}, {} rows, {} tokens): build s | {} |",
                f(&r["model"]),
                f(&r["params"]),
                f(&r["precision"]),
                f(&r["rows"]),
                f(&r["tokens"]),
                f(&r["s"])
            ),
            Some("first_pass") => format!(
                "| … {} s{} | {} |",
                f(&r["phase"]),
                if f(&r["phase"]).ends_with(" 1") {
                    " (compile + autotune + run)"
                } else {
                    ""
                },
                f(&r["s"])
            ),
            Some("nccl") if r.get("error").is_some() => {
                format!("| NCCL | error: {} |", f(&r["error"]))
            }
            Some("nccl") => format!(
                "| NCCL {} ({}), {} rank: in-place all-reduce of {} MB, ms (communicator {} s) | {} |",
                f(&r["version"]),
                f(&r["library"]),
                f(&r["ranks"]),
                f(&r["mb"]),
                f(&r["init_s"]),
                f(&r["ms"])
            ),
            Some("skipped") => format!("| {} | skipped: {} |", f(&r["what"]), f(&r["reason"])),
            _ => continue,
        };
        md += &line;
        md.push('\n');
    }
    md
}
