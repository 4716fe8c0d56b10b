//! The memory plan (`flowrl_engine::plan`): declared buffers placed in pools, the peak rule
//! (resident + the heaviest set of nodes that may run at once + what host memory retains of the
//! others), unknown kinds, capacities and what to change, the JSON schema.

use flowrl_engine::plan::{DeviceInfo, Plan, Pool, RETAINED, plan, render, to_json};
use flowrl_engine::*;
use serde::Deserialize;

const MIB: u64 = 1 << 20;

/// A node that holds `bytes` on its device while it runs (and `host` on the host for good).
struct Work;

#[derive(Deserialize, Params)]
struct WorkParams {
    #[param(default = 0)]
    bytes: u64,
    #[param(default = 0)]
    host: u64,
    #[param(default = 0.0)]
    flops: f64,
}

const N: ValueType<u64> = ValueType::new("N");
const IN: Port<u64> = Port::new("n", N);
const OUT: Port<u64> = Port::new("n", N);

impl NodeKind for Work {
    fn name(&self) -> &str {
        "mem.work"
    }
    fn doc(&self) -> &str {
        "holds `bytes` while it runs"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![IN.spec().optional()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![OUT.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        WorkParams::param_specs()
    }
    fn footprint(&self, ctx: &PlanCtx) -> Option<Footprint> {
        let p = ctx.parse::<WorkParams>().ok()?;
        let mut f = Footprint::default();
        f.resident(Item::new("host buffer", p.host * MIB, Place::Host));
        f.phase(
            "run",
            vec![Item::new("activations", p.bytes * MIB, Place::Device).hint("lower bytes")],
        );
        f.phase(
            "tail",
            vec![Item::new("tail", p.bytes * MIB / 2, Place::Device)],
        );
        f.flops = p.flops;
        Some(f)
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        anyhow::bail!("planning only")
    }
}

/// A kind that declares nothing.
struct Silent;

impl NodeKind for Silent {
    fn name(&self) -> &str {
        "mem.silent"
    }
    fn doc(&self) -> &str {
        "declares nothing"
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![IN.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![]
    }
    fn params(&self) -> Vec<ParamSpec> {
        vec![]
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        anyhow::bail!("planning only")
    }
}

/// Weights of `mib` MiB on the run's first device.
struct Weights;

#[derive(Deserialize, Params)]
struct WeightsParams {
    #[param(default = 0)]
    mib: u64,
}

impl ResourceKind for Weights {
    fn name(&self) -> &str {
        "weights"
    }
    fn section(&self) -> &str {
        "weights"
    }
    fn doc(&self) -> &str {
        "weights"
    }
    fn params(&self) -> Vec<ParamSpec> {
        WeightsParams::param_specs()
    }
    fn footprint(&self, ctx: &PlanCtx) -> Option<ResourcePlan> {
        let p = ctx.parse::<WeightsParams>().ok()?;
        let mut plan = ResourcePlan::default();
        plan.footprint
            .resident(Item::new("weights", p.mib * MIB, Place::Device).hint("smaller weights"));
        Some(plan)
    }
    fn build(&self, _: &Params, _: &BuildContext) -> anyhow::Result<ResourceValue> {
        anyhow::bail!("planning only")
    }
}

fn registry() -> Registry {
    Registry::new()
        .with_kind(Work)
        .with_kind(Silent)
        .with_resource_kind(Weights)
}

/// `a` feeds `b` and `c`, which do not wait for each other; `d` (undeclared) reads `c`.
const GRAPH: &str = r#"
[run]
steps = 1
device = "cpu"
workers = 2

[weights.w]
mib = 100

[nodes.a]
kind = "mem.work"
bytes = 10
host = 5
flops = 1e12

[nodes.b]
kind = "mem.work"
inputs = { n = "a.n" }
bytes = 40
flops = 2e12

[nodes.c]
kind = "mem.work"
inputs = { n = "a.n" }
bytes = 30

[nodes.d]
kind = "mem.silent"
inputs = { n = "c.n" }
"#;

fn planned(sets: &[&str], info: DeviceInfo, runtime: u64) -> Plan {
    let o: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let (graph, _) = compile(&registry(), "g.toml", GRAPH, &Override::sets(&o))
        .unwrap_or_else(|f| panic!("{}", f.render()));
    plan(&graph, &|_| info.clone(), &|| runtime)
}

fn peak(p: &Plan, pool: Pool) -> u64 {
    p.pool(pool).unwrap().peak_bytes
}

#[test]
fn nodes_that_may_run_at_once_add_up_and_the_others_are_partly_retained() {
    let p = planned(&[], DeviceInfo::default(), 7 * MIB);
    // b and c may overlap (two workers): 100 + 40 + 30 on the device; a's 10 is retained in part.
    let retained = (10.0 * MIB as f64 * RETAINED) as u64;
    assert_eq!(
        peak(&p, Pool::Device(DeviceSpec::Cpu(0))),
        170 * MIB + retained
    );
    let at: Vec<&str> = p
        .pool(Pool::Device(DeviceSpec::Cpu(0)))
        .unwrap()
        .peak_at
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(at, ["b", "c"]);
    assert_eq!(peak(&p, Pool::Host), 5 * MIB);
    // The process: the CPU device, the host and the runtime.
    assert_eq!(
        peak(&p, Pool::Process),
        170 * MIB + retained + 5 * MIB + 7 * MIB
    );
    assert_eq!(p.unknown, ["node `d` (kind `mem.silent`)"]);
    assert_eq!(p.step_flops, 3e12);
}

#[test]
fn one_worker_runs_one_node_at_a_time() {
    let p = planned(&["run.workers=1"], DeviceInfo::default(), 0);
    // b alone; a's and c's largest phases retained in part.
    let retained = ((10 + 30) as f64 * MIB as f64 * RETAINED) as u64;
    assert_eq!(
        peak(&p, Pool::Device(DeviceSpec::Cpu(0))),
        140 * MIB + retained
    );
}

#[test]
fn step_time_comes_from_the_device_throughput() {
    let info = DeviceInfo {
        memory: None,
        flops: vec![("f32".into(), 1e12)],
        flops_source: "test".into(),
    };
    let p = planned(&[], info, 0);
    assert!((p.step_seconds_estimate.unwrap() - 3.0).abs() < 1e-9);
    assert!(
        planned(&[], DeviceInfo::default(), 0)
            .step_seconds_estimate
            .is_none()
    );
}

#[test]
fn a_gpu_that_is_too_small_is_an_overflow_with_what_to_change() {
    let o: Vec<String> = vec!["run.device=\"vulkan\"".into()];
    let target = compile::Target {
        machine: device::Machine {
            cuda_compiled: false,
            gpus: 0,
            vulkan_compiled: true,
        },
        world: 1,
    };
    let (graph, _) =
        compile::compile_for(&registry(), "g.toml", GRAPH, &Override::sets(&o), &target)
            .unwrap_or_else(|f| panic!("{}", f.render()));
    let small = DeviceInfo {
        memory: Some((150 * MIB, "test card".into())),
        flops: vec![],
        flops_source: String::new(),
    };
    let p = plan(&graph, &|_| small.clone(), &|| 0);
    let over = p.overflows();
    assert_eq!(over.len(), 1, "{}", render(&p));
    assert_eq!(over[0].pool, Pool::Device(DeviceSpec::Vulkan(0)));
    // A GPU pool retains nothing of the other nodes (cubecl's pools, not the host allocator).
    assert_eq!(over[0].peak_bytes, 170 * MIB);
    let text = render(&p);
    for want in [
        "DOES NOT FIT",
        "What to change",
        "vulkan:0: 20.0 MiB more than it holds",
        "- smaller weights",
        "- lower bytes",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let json = to_json(&p);
    assert_eq!(json["fits"], false);
    assert_eq!(json["devices"]["vulkan:0"]["fits"], false);
    assert_eq!(json["devices"]["vulkan:0"]["capacity_bytes"], 150 * MIB);
}

#[test]
fn the_json_has_the_documented_keys() {
    let p = planned(&[], DeviceInfo::default(), 3 * MIB);
    let j = to_json(&p);
    assert_eq!(
        j["devices"]["cpu:0"]["peak_bytes"],
        peak(&p, Pool::Device(DeviceSpec::Cpu(0)))
    );
    let breakdown = j["devices"]["cpu:0"]["breakdown"].as_array().unwrap();
    let sum: u64 = breakdown.iter().map(|e| e["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        sum,
        j["devices"]["cpu:0"]["peak_bytes"].as_u64().unwrap(),
        "the breakdown adds up to the peak"
    );
    for e in breakdown {
        assert!(e["node"].is_string() && e["phase"].is_string() && e["what"].is_string());
    }
    assert_eq!(j["host"]["peak_bytes"], 5 * MIB);
    assert_eq!(j["process_peak_bytes"], peak(&p, Pool::Process));
    assert_eq!(j["runtime_bytes"], 3 * MIB);
    assert_eq!(j["step_flops"], 3e12);
    assert!(j["step_seconds_estimate"].is_null());
    assert_eq!(j["unknown"][0], "node `d` (kind `mem.silent`)");
    let nodes: Vec<&str> = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["w", "a", "b", "c", "d"]);
}
