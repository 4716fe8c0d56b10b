//! `flowrl run`: the launch settings checked, the graph loaded for this process's device and
//! its memory plan checked, then the run.

use super::plan::refuse_overflow;
use super::{GraphInput, RunArgs, config_error, load, machine_plan};
use crate::compile::Override;
use crate::device::{DeviceSpec, device_list};
use crate::graph::Graph;
use crate::placement::Cluster;
use crate::registry::Registry;
use crate::run::{RunOptions, run};
use crate::rundir::RunDir;
use std::path::Path;
use std::process::ExitCode;

/// The device a process with a local rank (torchrun's `LOCAL_RANK`, Slurm's `SLURM_LOCALID`)
/// runs on: process L of a machine, one GPU each, takes the machine's GPU L — the graph's one GPU
/// (`cuda`, `cuda:0`, `auto` on a GPU machine) counted from there, as torchrun's convention wants
/// — unless `--device` names it, or `CUDA_VISIBLE_DEVICES` already gives the process one GPU (a
/// launcher binding each task to its GPU). `Ok(None)`: the graph's devices stand. A graph that
/// lists several devices per process, with local rank above 0, contradicts one process per GPU:
/// an error naming both.
fn local_device(
    cluster: Option<&Cluster>,
    devices: &[DeviceSpec],
    device_flag: Option<&str>,
    visible: Option<&str>,
) -> Result<Option<String>, String> {
    let Some((local, var)) = cluster.and_then(|c| c.local_rank) else {
        return Ok(None);
    };
    let bound = visible.is_some_and(|v| v.split(',').filter(|s| !s.trim().is_empty()).count() == 1);
    if local == 0 || device_flag.is_some() || bound {
        return Ok(None);
    }
    match devices {
        [DeviceSpec::Cpu(_)] => Ok(None),
        [DeviceSpec::Cuda(n)] => Ok(Some(format!("cuda:{}", n + local))),
        [DeviceSpec::Vulkan(n)] => Ok(Some(format!("vulkan:{}", n + local))),
        several => Err(format!(
            "{var}={local} contradicts the graph's [run] devices = [{}]: with one process per \
             GPU each process names one device (the process of {var} L runs on the graph's GPU \
             counted from L, or on --device); a graph that lists several devices runs one \
             process per machine",
            device_list(several)
        )),
    }
}

pub(super) fn cmd_run(a: &RunArgs, registry: &Registry) -> anyhow::Result<ExitCode> {
    let cluster = match a.cluster.cluster() {
        Ok(c) => c,
        Err(msg) => return Ok(config_error(msg)),
    };
    let world = cluster.as_ref().map_or(1, |c| c.world);
    let extra: Vec<Override> = a
        .steps
        .map(|s| Override::new("--steps", format!("run.steps={s}")))
        .into_iter()
        .collect();
    let (graph_file, out, resume) = match &a.resume {
        Some(dir) => (RunDir::open(dir)?.graph_file(), Some(dir.clone()), true),
        None => (
            a.graph.clone().expect("clap requires it"),
            a.out.clone(),
            false,
        ),
    };
    let mut graph = match load(registry, &graph_file, &a.input, extra.clone(), world)? {
        Ok(g) => g,
        Err(code) => return Ok(code),
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    match local_device(
        cluster.as_ref(),
        &graph.devices,
        a.input.device.as_deref(),
        visible.as_deref(),
    ) {
        Ok(None) => {}
        Ok(Some(device)) => {
            let input = GraphInput {
                device: Some(device),
                ..a.input.clone()
            };
            graph = match load(registry, &graph_file, &input, extra, world)? {
                Ok(g) => g,
                Err(code) => return Ok(code),
            };
        }
        Err(msg) => return Ok(config_error(msg)),
    }
    let plan = machine_plan(&graph, registry, None);
    if let Some(code) = refuse_overflow(&plan, a.force) {
        return Ok(code);
    }
    let cluster = cluster.map(|mut c| {
        c.fingerprint = fingerprint(&graph_file, a, &graph, a.resume.as_deref());
        c
    });
    let opts = RunOptions {
        plan: Some(crate::run::PlanRecord::of(
            &plan,
            registry.device_probe().cloned(),
        )),
        graph_file: Some(graph_file),
        out,
        resume,
        force: a.force,
        progress: a.progress,
        cluster,
    };
    let s = run(graph, &opts)?;
    if let Some(step) = s.stopped_after {
        println!(
            "stopped by SIGTERM after step {step} of {} (checkpoint written); run directory: {}",
            s.steps,
            s.run_dir.display()
        );
    } else if s.first_step >= s.steps {
        println!(
            "{}: all {} steps already ran (pass --steps N to run more)",
            s.run_dir.display(),
            s.first_step
        );
    } else {
        println!(
            "finished steps {}..{} in {:.1}s; run directory: {}",
            s.first_step + 1,
            s.steps,
            s.seconds,
            s.run_dir.display()
        );
    }
    if let Some(p) = s.plot {
        println!("plots: {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// What every process of a run must agree on (checked at the rendezvous): the graph file's text
/// with the overrides and steps, the number of devices per process (replica indices depend on
/// it), and whether it resumes, from which checkpoint step (`resume`: the run directory). The
/// devices themselves may differ (`--device cuda:$LOCAL_RANK`).
fn fingerprint(
    graph_file: &Path,
    a: &RunArgs,
    graph: &Graph,
    resume: Option<&Path>,
) -> Vec<(String, String)> {
    let resumes = match resume {
        None => "no".to_string(),
        Some(dir) => match RunDir::open(dir).and_then(|d| d.resume_point()) {
            Ok(Some(point)) => format!("from the checkpoint of step {}", point.completed_steps),
            Ok(None) => "from step 1 (no checkpoint yet)".to_string(),
            Err(e) => format!("from an unusable run directory ({e:#})"),
        },
    };
    let mut hash = crc32fast::Hasher::new();
    hash.update(&std::fs::read(graph_file).unwrap_or_default());
    for s in &a.input.set {
        hash.update(s.as_bytes());
        hash.update(b"\n");
    }
    vec![
        (
            "graph file and --set overrides (crc32)".into(),
            format!("{:08x}", hash.finalize()),
        ),
        ("steps".into(), graph.run.steps.to_string()),
        (
            "devices per process".into(),
            graph.devices.len().to_string(),
        ),
        ("--resume".into(), resumes),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cluster(local: Option<usize>) -> Cluster {
        Cluster {
            rank: 3,
            world: 4,
            master: "h:1".into(),
            timeout: Duration::from_secs(1),
            fingerprint: Vec::new(),
            local_rank: local.map(|l| (l, "LOCAL_RANK")),
        }
    }

    #[test]
    fn the_local_rank_picks_the_processs_gpu() {
        let one = [DeviceSpec::Cuda(0)];
        let c = cluster(Some(3));
        assert_eq!(
            local_device(Some(&c), &one, None, None),
            Ok(Some("cuda:3".into()))
        );
        let vk = [DeviceSpec::Vulkan(1)];
        assert_eq!(
            local_device(Some(&c), &vk, None, None),
            Ok(Some("vulkan:4".into()))
        );
        // The devices stand: CPU replicas, local rank 0 or none, --device, a bound GPU.
        assert_eq!(
            local_device(Some(&c), &[DeviceSpec::Cpu(0)], None, None),
            Ok(None)
        );
        assert_eq!(
            local_device(Some(&cluster(Some(0))), &one, None, None),
            Ok(None)
        );
        assert_eq!(
            local_device(Some(&cluster(None)), &one, None, None),
            Ok(None)
        );
        assert_eq!(local_device(None, &one, None, None), Ok(None));
        assert_eq!(local_device(Some(&c), &one, Some("cuda:1"), None), Ok(None));
        assert_eq!(local_device(Some(&c), &one, None, Some("5")), Ok(None));
        assert_eq!(
            local_device(Some(&c), &one, None, Some("0,1,2,3")),
            Ok(Some("cuda:3".into()))
        );
        let err = local_device(
            Some(&c),
            &[DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)],
            None,
            None,
        )
        .unwrap_err();
        assert!(
            err.starts_with(
                "LOCAL_RANK=3 contradicts the graph's [run] devices = [cuda:0, cuda:1]"
            ),
            "{err}"
        );
    }
}
