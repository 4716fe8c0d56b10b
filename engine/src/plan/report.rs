//! The plan as a table (`flowrl plan`, and the error of a graph that does not fit) and as JSON
//! (`flowrl plan --json`, and `plan.json` in a run directory; schema in docs/plan.md).

use super::{Plan, Pool, PoolPlan};
use serde_json::{Value, json};
use std::fmt::Write as _;

/// Bytes for people: `1.23 GiB`, `45.6 MiB`.
pub fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

fn pool_heading(p: &PoolPlan) -> String {
    let what = match p.pool {
        Pool::Device(d) if d.type_name() == "cpu" => format!("{d} (host RAM)"),
        Pool::Device(d) => d.to_string(),
        Pool::Host => "host (data, images, tokenizers)".into(),
        Pool::Process => "process (host + CPU devices + runtime: peak resident set)".into(),
    };
    let mut s = format!("{what}: peak {}", gib(p.peak_bytes));
    if let Some((cap, src)) = &p.capacity {
        let _ = write!(s, " of {} ({src})", gib(*cap));
        if p.exceeds() {
            s.push_str(" — DOES NOT FIT");
        }
    }
    if !p.peak_at.is_empty() {
        let at: Vec<String> = p
            .peak_at
            .iter()
            .map(|(n, ph)| format!("{n}/{ph}"))
            .collect();
        let _ = write!(s, ", during {}", at.join(" + "));
    }
    s
}

/// The plan as text: per pool its peak and breakdown, the compute estimate, what is unknown,
/// and what to change where a pool does not fit.
pub fn render(plan: &Plan) -> String {
    let mut s = String::new();
    s.push_str(
        "per node and resource (bytes on each of its devices / on the host; TFLOP per step):\n",
    );
    let wn = plan
        .summaries
        .iter()
        .map(|n| n.name.len())
        .max()
        .unwrap_or(0);
    let wk = plan
        .summaries
        .iter()
        .map(|n| n.kind.len())
        .max()
        .unwrap_or(0);
    for n in &plan.summaries {
        let phases = if n.unknown {
            "unknown: the kind declares no memory".to_string()
        } else if n.phases.is_empty() {
            "nothing of note".to_string()
        } else {
            n.phases
                .iter()
                .map(|(p, d, h)| {
                    if *h > 0 {
                        format!("{p} {} / {}", gib(*d), gib(*h))
                    } else {
                        format!("{p} {}", gib(*d))
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let flops = if n.flops > 0.0 {
            format!("  [{:.3} TFLOP]", n.flops / 1e12)
        } else {
            String::new()
        };
        let _ = writeln!(s, "  {:wn$}  {:wk$}  {phases}{flops}", n.name, n.kind);
    }
    s.push('\n');
    for p in &plan.pools {
        if p.pool == Pool::Host && p.breakdown.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{}", pool_heading(p));
        let wn = p.breakdown.iter().map(|e| e.node.len()).max().unwrap_or(0);
        let wp = p.breakdown.iter().map(|e| e.phase.len()).max().unwrap_or(0);
        for e in &p.breakdown {
            let _ = writeln!(
                s,
                "  {:>10}  {:wn$}  {:wp$}  {}",
                gib(e.bytes),
                e.node,
                e.phase,
                e.what
            );
        }
    }
    let _ = write!(s, "compute: {:.3} TFLOP per step", plan.step_flops / 1e12);
    match plan.step_seconds_estimate {
        Some(t) => {
            let _ = writeln!(s, ", about {t:.1} s per step (estimate)");
        }
        None => s.push_str(", step time unknown (no throughput figure for a device)\n"),
    }
    for (d, info) in &plan.devices {
        if !info.flops.is_empty() {
            let rates: Vec<String> = info
                .flops
                .iter()
                .map(|(p, f)| format!("{p} {:.1} TFLOP/s", f / 1e12))
                .collect();
            let _ = writeln!(s, "  {d}: {} ({})", rates.join(", "), info.flops_source);
        }
    }
    for u in &plan.unknown {
        let _ = writeln!(s, "unknown: {u} declares no memory (not counted)");
    }
    for u in &plan.not_sized {
        let _ = writeln!(s, "not sized: {u}");
    }
    let over = plan.overflows();
    if !over.is_empty() {
        s.push_str("\nWhat to change:\n");
        for p in over {
            let _ = writeln!(
                s,
                "  {}: {} more than it holds",
                p.pool,
                gib(p.peak_bytes - p.capacity.as_ref().map_or(0, |c| c.0))
            );
            let mut seen = Vec::new();
            for e in &p.breakdown {
                if let Some(h) = &e.hint
                    && !seen.contains(h)
                {
                    let _ = writeln!(s, "    - {h} ({} {}: {})", e.node, e.what, gib(e.bytes));
                    seen.push(h.clone());
                }
                if seen.len() == 4 {
                    break;
                }
            }
            if seen.is_empty() {
                s.push_str("    - lower the batch sizes, or run on a machine with more memory\n");
            }
        }
    }
    s
}

fn pool_json(p: &PoolPlan) -> Value {
    json!({
        "peak_bytes": p.peak_bytes,
        "capacity_bytes": p.capacity.as_ref().map(|c| c.0),
        "capacity_source": p.capacity.as_ref().map(|c| c.1.clone()),
        "fits": !p.exceeds(),
        "peak_at": p.peak_at.iter().map(|(n, ph)| json!({"node": n, "phase": ph})).collect::<Vec<_>>(),
        "breakdown": p.breakdown.iter().map(|e| json!({
            "node": e.node, "phase": e.phase, "what": e.what, "bytes": e.bytes,
        })).collect::<Vec<_>>(),
    })
}

/// The plan as JSON (schema in docs/plan.md).
pub fn to_json(plan: &Plan) -> Value {
    let mut devices = serde_json::Map::new();
    for p in &plan.pools {
        if let Pool::Device(d) = p.pool {
            let mut v = pool_json(p);
            if let Some((_, info)) = plan.devices.iter().find(|(x, _)| *x == d) {
                v["flops_per_second"] = Value::Object(
                    info.flops
                        .iter()
                        .map(|(p, f)| (p.clone(), json!(f)))
                        .collect(),
                );
                v["flops_source"] = json!(info.flops_source);
            }
            devices.insert(d.to_string(), v);
        }
    }
    let host = plan.pool(Pool::Host).map(pool_json);
    let process = plan.pool(Pool::Process);
    let nodes: Vec<Value> = plan
        .summaries
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "kind": n.kind,
                "declared": !n.unknown,
                "phases": n.phases.iter().map(|(p, d, h)| json!({"phase": p, "device_bytes": d, "host_bytes": h})).collect::<Vec<_>>(),
                "flops": n.flops,
            })
        })
        .collect();
    json!({
        "nodes": nodes,
        "devices": devices,
        "host": host,
        "process": process.map(pool_json),
        "process_peak_bytes": process.map(|p| p.peak_bytes),
        "runtime_bytes": plan.runtime_bytes,
        "step_flops": plan.step_flops,
        "step_seconds_estimate": plan.step_seconds_estimate,
        "unknown": plan.unknown,
        "not_sized": plan.not_sized,
        "fits": plan.overflows().is_empty(),
    })
}
