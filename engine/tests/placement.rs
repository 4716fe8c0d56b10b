//! Placement: `[run] device(s)` and node `device` in graphs, their checks against a described
//! machine (no GPU needed), the per-node placement rule, `ValidateCtx::world_replicas`, and
//! what `Session` and the exports make of it.

mod testkit;

use flowrl_engine::compile::{Target, compile_for};
use flowrl_engine::device::Machine;
use flowrl_engine::export::{Format, export};
use flowrl_engine::{Cluster, Code, DeviceSpec, Graph, Override, Session};
use std::time::Duration;

const CPU_ONLY: Machine = Machine {
    cuda_compiled: false,
    gpus: 0,
    vulkan_compiled: false,
};
const TWO_GPUS: Machine = Machine {
    cuda_compiled: true,
    gpus: 2,
    vulkan_compiled: false,
};

fn target(machine: Machine, world: usize) -> Target {
    Target { machine, world }
}

/// A source feeding a data-parallel shard, a plain add and a pinned shard; `RUN` is replaced by
/// the `[run]` lines under test.
const GRAPH: &str = r#"[run]
RUN

[nodes.src]
kind = "test.source"
count = 4

[nodes.shard]
kind = "test.shard"
inputs = { n = "src.n" }

[nodes.add]
kind = "test.add"
inputs = { a = "src.n" }
"#;

fn with_run(run: &str) -> String {
    GRAPH.replace("RUN", run)
}

fn ok(text: &str, sets: &[&str], t: Target) -> Graph {
    let o: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    testkit::compiled(compile_for(
        &testkit::registry(),
        "g.toml",
        text,
        &Override::sets(&o),
        &t,
    ))
}

/// (code, message) of every diagnostic, and the rendered text.
fn errors(text: &str, overrides: &[Override], t: Target) -> (Vec<(Code, String)>, String) {
    let result = compile_for(&testkit::registry(), "g.toml", text, overrides, &t);
    testkit::failed(result, text)
}

fn devices(g: &Graph, node: &str) -> Vec<DeviceSpec> {
    g.node_devices(g.node_id(node).unwrap())
}

#[test]
fn run_devices_and_the_per_node_placement_rule() {
    let g = ok(
        &with_run("devices = [\"cpu:0\", \"cpu:1\"]"),
        &[],
        target(CPU_ONLY, 1),
    );
    let both = vec![DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)];
    assert_eq!(g.devices, both);
    // Data-parallel kind: every run device; other kinds: the first.
    assert_eq!(devices(&g, "shard"), both);
    assert_eq!(devices(&g, "add"), vec![DeviceSpec::Cpu(0)]);
    assert_eq!(devices(&g, "src"), vec![DeviceSpec::Cpu(0)]);

    // `device` pins a node (data-parallel or not) to one of the run's devices.
    let pinned = with_run("devices = [\"cpu:0\", \"cpu:1\"]")
        .replace(
            "inputs = { n = \"src.n\" }",
            "inputs = { n = \"src.n\" }\ndevice = \"cpu:1\"",
        )
        .replace(
            "inputs = { a = \"src.n\" }",
            "inputs = { a = \"src.n\" }\ndevice = \"cpu:1\"",
        );
    let g = ok(&pinned, &[], target(CPU_ONLY, 1));
    assert_eq!(devices(&g, "shard"), vec![DeviceSpec::Cpu(1)]);
    assert_eq!(devices(&g, "add"), vec![DeviceSpec::Cpu(1)]);
    assert!(!g.nodes[g.node_id("shard").unwrap()].spans_run_devices());

    // `device = "X"` alone is `devices = ["X"]`; `cpu` is `cpu:0`, `cuda` is `cuda:0`; `auto`
    // (and no device at all) is the CPU without CUDA and cuda:0 with GPUs.
    for (run, machine, want) in [
        ("device = \"cpu\"", CPU_ONLY, DeviceSpec::Cpu(0)),
        ("device = \"cpu:3\"", CPU_ONLY, DeviceSpec::Cpu(3)),
        ("device = \"auto\"", CPU_ONLY, DeviceSpec::Cpu(0)),
        ("seed = 1", CPU_ONLY, DeviceSpec::Cpu(0)),
        ("device = \"auto\"", TWO_GPUS, DeviceSpec::Cuda(0)),
        ("device = \"cuda\"", TWO_GPUS, DeviceSpec::Cuda(0)),
    ] {
        let g = ok(&with_run(run), &[], target(machine, 1));
        assert_eq!(g.devices, vec![want], "{run}");
        assert_eq!(devices(&g, "shard"), vec![want], "{run}");
    }
    let g = ok(
        &with_run("devices = [\"cuda:1\", \"cuda:0\"]"),
        &[],
        target(TWO_GPUS, 1),
    );
    assert_eq!(g.devices, vec![DeviceSpec::Cuda(1), DeviceSpec::Cuda(0)]);
    assert_eq!(devices(&g, "add"), vec![DeviceSpec::Cuda(1)]);
}

#[test]
fn cuda_beyond_the_machine_is_an_error_with_the_numbers() {
    let text = with_run("devices = [\"cuda:0\", \"cuda:1\"]").replace(
        "inputs = { n = \"src.n\" }",
        "inputs = { n = \"src.n\" }\ndevice = \"cuda:3\"",
    );
    let (e, rendered) = errors(&text, &[], target(TWO_GPUS, 1));
    assert_eq!(
        e,
        vec![(
            Code::DeviceUnavailable,
            "node `shard` is placed on cuda:3, but this machine has 2 GPUs (cuda:0, cuda:1)".into()
        )]
    );
    assert!(rendered.contains("error[E0701]"), "{rendered}");
    assert!(rendered.contains("--> g.toml:11:10"), "{rendered}");

    let (e, rendered) = errors(
        &with_run("devices = [\"cuda:0\", \"cuda:2\"]"),
        &[],
        target(TWO_GPUS, 1),
    );
    assert_eq!(
        e,
        vec![(
            Code::DeviceUnavailable,
            "the run is placed on cuda:2, but this machine has 2 GPUs (cuda:0, cuda:1)".into()
        )]
    );
    assert!(rendered.contains("--> g.toml:2:22"), "{rendered}");

    let (e, rendered) = errors(&with_run("device = \"cuda:0\""), &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![(
            Code::DeviceUnavailable,
            "the run is placed on cuda:0, but this binary was built without CUDA".into()
        )]
    );
    assert!(rendered.contains("--features cuda"), "{rendered}");
    let no_gpu = Machine {
        cuda_compiled: true,
        gpus: 0,
        vulkan_compiled: false,
    };
    let (e, _) = errors(&with_run("device = \"cuda\""), &[], target(no_gpu, 1));
    assert_eq!(
        e[0].1,
        "the run is placed on cuda:0, but this machine has no NVIDIA GPU"
    );

    let (e, rendered) = errors(&with_run("device = \"vulkan\""), &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![(
            Code::DeviceUnavailable,
            "the run is placed on vulkan:0, but this binary was built without Vulkan".into()
        )]
    );
    assert!(
        rendered.contains("--features vulkan") && rendered.contains("mesa-vulkan-drivers"),
        "{rendered}"
    );
    let with_vulkan = Machine {
        vulkan_compiled: true,
        ..CPU_ONLY
    };
    let g = ok(
        &with_run("devices = [\"vulkan:0\"]"),
        &[],
        target(with_vulkan, 1),
    );
    assert_eq!(g.devices, vec![DeviceSpec::Vulkan(0)]);
}

#[test]
fn device_lists_are_checked_all_at_once() {
    let (e, rendered) = errors(
        &with_run("devices = [\"cpu:0\", \"tpu\", \"cpu\", \"cuda:0\", \"auto\"]"),
        &[],
        target(TWO_GPUS, 1),
    );
    assert_eq!(
        e,
        vec![
            (
                Code::InvalidValue,
                "`tpu` is not a device; expected `auto`, `cpu`, `cpu:N`, `cuda`, `cuda:N`, `vulkan` or `vulkan:N`".into()
            ),
            (
                Code::BadDeviceList,
                "`[run] devices` lists cpu:0 twice".into()
            ),
            (
                Code::BadDeviceList,
                "`[run] devices` mixes cpu and cuda devices".into()
            ),
            (
                Code::BadDeviceList,
                "`auto` cannot be one of `[run] devices`".into()
            ),
        ]
    );
    assert!(rendered.contains("first listed here"), "{rendered}");
    assert!(rendered.contains("cpu:0 is a cpu device"), "{rendered}");
    let (e, _) = errors(&with_run("devices = []"), &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![(Code::BadDeviceList, "`[run] devices` is empty".into())]
    );
    let (e, _) = errors(&with_run("devices = \"cpu:0\""), &[], target(CPU_ONLY, 1));
    assert_eq!(e[0].0, Code::WrongType);
}

#[test]
fn a_node_device_must_be_one_of_the_run_devices() {
    let text = with_run("devices = [\"cpu:0\", \"cpu:1\"]").replace(
        "inputs = { a = \"src.n\" }",
        "inputs = { a = \"src.n\" }\ndevice = \"cpu:2\"",
    );
    let (e, rendered) = errors(&text, &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![(
            Code::DeviceNotInRun,
            "node `add` is placed on cpu:2, which is not one of the run's devices [cpu:0, cpu:1]"
                .into()
        )]
    );
    assert!(rendered.contains("error[E0702]"), "{rendered}");
    // The same with one run device, and a CPU node in a GPU run.
    let text = with_run("device = \"cuda:1\"").replace(
        "inputs = { a = \"src.n\" }",
        "inputs = { a = \"src.n\" }\ndevice = \"cpu\"",
    );
    let (e, _) = errors(&text, &[], target(TWO_GPUS, 1));
    assert_eq!(
        e[0].1,
        "node `add` is placed on cpu:0, which is not one of the run's devices [cuda:1]"
    );
    // `auto` is for the run, not a node; `devices` is for the run, not a node.
    let text = with_run("device = \"cpu\"")
        .replace(
            "inputs = { a = \"src.n\" }",
            "inputs = { a = \"src.n\" }\ndevice = \"auto\"",
        )
        .replace(
            "inputs = { n = \"src.n\" }",
            "inputs = { n = \"src.n\" }\ndevices = [\"cpu:0\"]",
        );
    let (e, rendered) = errors(&text, &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![
            (
                Code::UnknownKey,
                "node `shard` cannot take `devices`; a node takes one `device`".into()
            ),
            (
                Code::InvalidValue,
                "node `add` cannot be placed on `auto`".into()
            ),
        ]
    );
    assert!(
        rendered.contains("kind `test.shard` is data-parallel: without `device` it runs one replica on each of `[run] devices`"),
        "{rendered}"
    );
}

#[test]
fn device_and_devices_conflict_at_the_second_key_and_at_the_argument() {
    let text = with_run("device = \"cpu\"\ndevices = [\"cpu:0\", \"cpu:1\"]");
    let (e, rendered) = errors(&text, &[], target(CPU_ONLY, 1));
    assert_eq!(
        e,
        vec![(
            Code::DeviceConflict,
            "`[run] device` and `[run] devices` are both given".into()
        )]
    );
    assert!(rendered.contains("--> g.toml:3:1"), "{rendered}");
    assert!(rendered.contains("error[E0704]"), "{rendered}");

    // `--device` overrides `[run] device` ...
    let g = ok(&with_run("device = \"cpu:1\""), &[], target(CPU_ONLY, 1));
    assert_eq!(g.devices, vec![DeviceSpec::Cpu(1)]);
    let o = [Override::device("cpu:2")];
    let g = match compile_for(
        &testkit::registry(),
        "g.toml",
        &with_run("device = \"cpu:1\""),
        &o,
        &target(CPU_ONLY, 1),
    ) {
        Ok((g, _)) => g,
        Err(f) => panic!("{}", f.render()),
    };
    assert_eq!(g.devices, vec![DeviceSpec::Cpu(2)]);
    // ... and replaces a list, with a warning at the argument.
    let (g, warnings) = match compile_for(
        &testkit::registry(),
        "g.toml",
        &with_run("devices = [\"cpu:0\", \"cpu:1\"]"),
        &[Override::device("cpu")],
        &target(CPU_ONLY, 1),
    ) {
        Ok(out) => out,
        Err(f) => panic!("{}", f.render()),
    };
    assert_eq!(g.devices, vec![DeviceSpec::Cpu(0)]);
    let rendered = flowrl_engine::diagnostic::render(&warnings, &g.sources);
    assert!(
        rendered.contains("warning[E0704]: `--device cpu` replaces the graph's `[run] devices`")
            && rendered.contains("--> --device:1:12"),
        "{rendered}"
    );
    // `--set run.devices=[...]` replaces the list.
    let g = ok(
        &with_run("devices = [\"cpu:0\", \"cpu:1\"]"),
        &["run.devices=[\"cpu:0\", \"cpu:1\", \"cpu:2\", \"cpu:3\"]"],
        target(CPU_ONLY, 1),
    );
    assert_eq!(devices(&g, "shard").len(), 4);
}

#[test]
fn kinds_see_their_replicas_over_devices_and_processes() {
    // count 4 over 2 devices × 1 process: fine; × 3 processes: 6 replicas, an error from the kind.
    let text = with_run("devices = [\"cpu:0\", \"cpu:1\"]");
    ok(&text, &[], target(CPU_ONLY, 1));
    ok(&text, &[], target(CPU_ONLY, 2));
    let (e, rendered) = errors(&text, &[], target(CPU_ONLY, 3));
    assert_eq!(
        e,
        vec![(
            Code::Constraint,
            "count 4 of `src` does not split over 6 replicas (2 devices × 3 processes)".into()
        )]
    );
    assert!(rendered.contains("--> g.toml:10:16"), "{rendered}");
    // A pinned data-parallel node has one replica per process.
    let pinned = text.replace(
        "inputs = { n = \"src.n\" }",
        "inputs = { n = \"src.n\" }\ndevice = \"cpu:1\"",
    );
    ok(&pinned, &[], target(CPU_ONLY, 4));
}

fn cluster(rank: usize, world: usize) -> Option<Cluster> {
    let launch = flowrl_engine::Launch {
        rank: Some(rank),
        world: Some(world),
        master: Some("127.0.0.1:3000"),
        timeout: Duration::from_secs(5),
    };
    Cluster::from_launch(&launch, &|_| None).unwrap()
}

#[test]
fn session_gives_each_node_its_placement() {
    let text = with_run("devices = [\"cpu:0\", \"cpu:1\"]");
    let g = ok(&text, &[], target(CPU_ONLY, 2));
    let mut s = Session::build(g, cluster(1, 2), None).unwrap();
    let p = |s: &Session, name: &str| s.placements()[s.graph.node_id(name).unwrap()].clone();
    assert_eq!(p(&s, "shard").devices.len(), 2);
    assert_eq!(p(&s, "add").devices, vec![DeviceSpec::Cpu(0)]);
    assert_eq!(p(&s, "add").cluster.unwrap().rank, 1);
    let r = s.run_step(0, &mut |_| {}).unwrap();
    assert_eq!(r.metrics["shard/local_replicas"], 2.0);
    assert_eq!(r.metrics["shard/world_replicas"], 4.0);
    assert_eq!(r.metrics["shard/first_replica"], 2.0);

    // The session runs on the devices the graph was compiled for (one, here) ...
    let g = ok(&text, &["run.devices=[\"cpu:1\"]"], target(CPU_ONLY, 1));
    let s = Session::build(g, None, None).unwrap();
    assert_eq!(p(&s, "shard").devices, vec![DeviceSpec::Cpu(1)]);
    assert_eq!(p(&s, "add").devices, vec![DeviceSpec::Cpu(1)]);
    // ... and refuses a cluster of another size than it was compiled for, whose replica counts
    // the kinds' constraints were not checked against.
    let g = ok(&text, &[], target(CPU_ONLY, 1));
    let e = format!(
        "{:#}",
        Session::build(g, cluster(0, 3), None).err().unwrap()
    );
    assert_eq!(
        e,
        "the graph was checked for 1 process(es), but this run has 3: compile it for the run's \
         processes (`--world 3`)"
    );
}

#[test]
fn exports_show_each_nodes_devices() {
    let text = with_run("devices = [\"cpu:0\", \"cpu:1\"]").replace(
        "inputs = { a = \"src.n\" }",
        "inputs = { a = \"src.n\" }\ndevice = \"cpu:1\"",
    );
    let g = ok(&text, &[], target(CPU_ONLY, 1));
    let dot = export(&g, Format::Dot);
    assert!(
        dot.contains("\"shard\\nkind: test.shard\\ndevice: cpu:0, cpu:1 · data-parallel\""),
        "{dot}"
    );
    assert!(
        dot.contains("\"add\\nkind: test.add\\ndevice: cpu:1\""),
        "{dot}"
    );
    assert!(
        dot.contains("\"src\\nkind: test.source\\ndevice: cpu:0\""),
        "{dot}"
    );
    let mm = export(&g, Format::Mermaid);
    assert!(
        mm.contains("n_shard[\"<b>shard</b><br/>test.shard<br/>cpu:0, cpu:1 · data-parallel\"]"),
        "{mm}"
    );
    let html = export(&g, Format::Html);
    assert!(
        html.contains("<td>cpu:0, cpu:1 · data-parallel</td>"),
        "{html}"
    );
    assert!(html.contains("devices <code>cpu:0, cpu:1</code>"), "{html}");
    let json: serde_json::Value = serde_json::from_str(&export(&g, Format::Json)).unwrap();
    assert_eq!(json["devices"], serde_json::json!(["cpu:0", "cpu:1"]));
    let node = |name: &str| {
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        node("shard")["devices"],
        serde_json::json!(["cpu:0", "cpu:1"])
    );
    assert_eq!(node("shard")["data_parallel"], true);
    assert_eq!(node("add")["devices"], serde_json::json!(["cpu:1"]));
    assert_eq!(node("add")["data_parallel"], false);
}
