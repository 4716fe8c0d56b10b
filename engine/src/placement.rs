//! Placement: the devices a node runs on in this process, and the processes of a multi-process
//! run.
//!
//! A data-parallel node kind ([`crate::NodeKind::data_parallel`]) runs one replica per device of
//! its [`Placement`] in every process of the run: `devices.len() × cluster.world` replicas in all.
//! Replica `i` of process `rank` has the global index `rank × devices.len() + i`; work (prompts,
//! rows, micro-batches) is split over global indices, so a run gives the same numbers whether its
//! replicas are threads of one process or processes on several machines.

use std::time::Duration;

use crate::device::DeviceSpec;
use crate::node::{Subject, ValidateCtx};

/// The devices a node runs on in a process whose devices are `run_devices` (the placement rule):
/// a node pinned with `device = "..."` runs on that device alone; otherwise a data-parallel kind
/// runs one replica on every run device and any other kind runs on the first.
pub fn node_devices(
    data_parallel: bool,
    pinned: Option<DeviceSpec>,
    run_devices: &[DeviceSpec],
) -> Vec<DeviceSpec> {
    match pinned {
        Some(d) => vec![d],
        None if data_parallel => run_devices.to_vec(),
        None => run_devices.iter().take(1).copied().collect(),
    }
}

/// Where one node runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// This process's devices for the node, one replica each (never empty).
    pub devices: Vec<DeviceSpec>,
    /// The processes of a multi-process run; `None` when this process is the whole run.
    pub cluster: Option<Cluster>,
}

impl Placement {
    /// One device, one process.
    pub fn single(device: DeviceSpec) -> Self {
        Placement {
            devices: vec![device],
            cluster: None,
        }
    }

    /// Replicas in this process.
    pub fn local_replicas(&self) -> usize {
        self.devices.len()
    }

    /// Replicas over all processes.
    pub fn world_replicas(&self) -> usize {
        self.devices.len() * self.cluster.as_ref().map_or(1, |c| c.world)
    }

    /// Global index of this process's first replica.
    pub fn first_replica(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.rank) * self.devices.len()
    }

    /// True when more than one replica runs the node.
    pub fn is_parallel(&self) -> bool {
        self.world_replicas() > 1
    }
}

/// The processes of a multi-process run (`flowrl run --rank R --world W --master HOST:PORT`, or
/// the variables torchrun and Slurm set: [`Cluster::from_launch`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cluster {
    /// This process, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
    /// Where rank 0 serves the rendezvous and the collectives, `HOST:PORT`.
    pub master: String,
    /// How long the rendezvous and each collective operation wait for the other processes
    /// before the run stops with an error naming the missing one.
    pub timeout: Duration,
    /// What every process must agree on, as (name, value) pairs; rank 0 refuses a process whose
    /// list differs, naming the difference.
    pub fingerprint: Vec<(String, String)>,
    /// This process's index among the run's processes on its machine (torchrun's `LOCAL_RANK`,
    /// Slurm's `SLURM_LOCALID`), with the variable that said it; `None` when neither is set.
    pub local_rank: Option<(usize, &'static str)>,
}

/// What runs when this process's run ends (see [`on_run_end`]).
type RunEnd = Box<dyn FnOnce(Option<&str>) + Send>;

static RUN_END: std::sync::Mutex<Vec<RunEnd>> = std::sync::Mutex::new(Vec::new());

/// Registers `f` to run once when this process's run ends, with the error's text when it failed:
/// how the crate that joined the run's processes leaves them, or tells them why it stops.
pub fn on_run_end(f: RunEnd) {
    RUN_END.lock().unwrap_or_else(|e| e.into_inner()).push(f);
}

/// Runs (and forgets) what [`on_run_end`] registered; `failure` is the run's error, if any.
pub fn run_ended(failure: Option<&str>) {
    STOP_VOTE.lock().unwrap_or_else(|e| e.into_inner()).take();
    let ends = std::mem::take(&mut *RUN_END.lock().unwrap_or_else(|e| e.into_inner()));
    for f in ends {
        f(failure);
    }
}

/// How the processes of a run agree, at a step boundary, on whether to stop: given the step just
/// finished and whether this process was asked to (a SIGTERM), true when any process was.
type StopVote = Box<dyn Fn(u64, bool) -> anyhow::Result<bool> + Send>;

static STOP_VOTE: std::sync::Mutex<Option<StopVote>> = std::sync::Mutex::new(None);

/// Registers how this process's run takes [`stop_voted`]'s vote: what the crate that joined the
/// run's processes does, so that a SIGTERM to any process stops every process after the same
/// step. Replaced by the next registration; forgotten when the run ends ([`run_ended`]).
pub fn on_stop_vote(f: StopVote) {
    *STOP_VOTE.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
}

/// Whether the run stops after `step`: `asked` (this process got a SIGTERM), or-ed over the
/// run's processes when they have joined ([`on_stop_vote`]); `asked` alone otherwise. Every
/// process of a joined run calls it after every step, so that the vote pairs up.
pub fn stop_voted(step: u64, asked: bool) -> anyhow::Result<bool> {
    match STOP_VOTE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(vote) => vote(step, asked),
        None => Ok(asked),
    }
}

/// Placement as seen by a kind's `validate` hook, so that a kind can refuse work that would not
/// split evenly over its replicas (uneven micro-batch counts would deadlock a collective).
impl ValidateCtx<'_> {
    /// The devices of this process the node runs on (for a resource: the run's first device).
    pub fn devices(&self) -> Vec<DeviceSpec> {
        match self.subject {
            Subject::Node(i) => self.graph.node_devices(i),
            Subject::Resource(_) => self.graph.devices.iter().take(1).copied().collect(),
        }
    }

    /// Processes of the run the graph is checked for (`flowrl validate --world W`; 1 by default).
    pub fn world(&self) -> usize {
        self.graph.world
    }

    /// Replicas of this node over all processes: local devices × processes.
    pub fn world_replicas(&self) -> usize {
        self.devices().len() * self.world()
    }
}

/// How a process was told about its run: its flags (`None`: not given) and the launcher's
/// environment.
pub struct Launch<'a> {
    pub rank: Option<usize>,
    pub world: Option<usize>,
    pub master: Option<&'a str>,
    pub timeout: Duration,
}

/// The port rank 0 listens on when the launcher names its host but no port (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

impl Cluster {
    /// The rank and the number of processes: the flags, else torchrun's `RANK` and `WORLD_SIZE`,
    /// else Slurm's `SLURM_PROCID` and `SLURM_NTASKS` (torchrun's win when both are set: torchrun
    /// inside an allocation numbers the processes itself); 0 of 1 when nothing says otherwise. A
    /// flag and a variable that disagree are an error naming both.
    pub fn ranks(
        launch: &Launch<'_>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(usize, usize), String> {
        let torchrun = env("RANK").is_some() || env("WORLD_SIZE").is_some();
        let (rank_var, world_var) = if torchrun {
            ("RANK", "WORLD_SIZE")
        } else {
            ("SLURM_PROCID", "SLURM_NTASKS")
        };
        let number = |var: &str| -> Result<Option<usize>, String> {
            env(var)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("{var}=`{v}` is not a number"))
                })
                .transpose()
        };
        let agree = |flag: &str,
                     given: Option<usize>,
                     var: &str|
         -> Result<(Option<usize>, String), String> {
            match (given, number(var)?) {
                (Some(f), Some(e)) if f != e => Err(format!(
                    "{flag} {f} contradicts {var}={e} in the environment"
                )),
                (Some(f), _) => Ok((Some(f), format!("{flag} {f}"))),
                (None, Some(e)) => Ok((Some(e), format!("{var}={e}"))),
                (None, None) => Ok((None, String::new())),
            }
        };
        let (rank, rank_said) = agree("--rank", launch.rank, rank_var)?;
        let (world, world_said) = agree("--world", launch.world, world_var)?;
        let world_n = world.unwrap_or(1);
        let rank_n = rank.unwrap_or(0);
        if world_n == 0 {
            return Err(format!("{world_said}: a run needs at least one process"));
        }
        if rank_n >= world_n {
            let world_said = if world.is_some() {
                world_said
            } else {
                "one process (no --world or WORLD_SIZE)".to_string()
            };
            return Err(format!(
                "{rank_said} must be below {world_said} (ranks are 0..{})",
                world_n - 1
            ));
        }
        Ok((rank_n, world_n))
    }

    /// A checked cluster from the flags and the launcher's environment ([`Cluster::ranks`];
    /// rank 0's address from `--master`, else `MASTER_ADDR` and `MASTER_PORT`, else the first host
    /// of Slurm's node list and `MASTER_PORT` or [`DEFAULT_MASTER_PORT`]): `None` for a
    /// one-process run. The error names the flag or variable at fault.
    pub fn from_launch(
        launch: &Launch<'_>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Cluster>, String> {
        if launch.timeout.is_zero() {
            return Err("--collective-timeout must be at least 1 second".into());
        }
        let (rank, world) = Self::ranks(launch, env)?;
        if world == 1 {
            return Ok(None);
        }
        let port = env("MASTER_PORT");
        let from_env = match (env("MASTER_ADDR"), &port) {
            (Some(host), Some(port)) => {
                Some((format!("{host}:{port}"), "MASTER_ADDR and MASTER_PORT"))
            }
            (Some(host), None) => Some((format!("{host}:{DEFAULT_MASTER_PORT}"), "MASTER_ADDR")),
            (None, _) => env("SLURM_JOB_NODELIST")
                .or_else(|| env("SLURM_NODELIST"))
                .and_then(|list| first_host(&list))
                .map(|host| {
                    let port = port
                        .clone()
                        .unwrap_or_else(|| DEFAULT_MASTER_PORT.to_string());
                    (
                        format!("{host}:{port}"),
                        "the first host of SLURM_JOB_NODELIST",
                    )
                }),
        };
        let master = match (launch.master, from_env) {
            (Some(flag), Some((env, what))) if flag != env => {
                return Err(format!("--master {flag} contradicts {what} ({env})"));
            }
            (Some(flag), _) => flag.to_string(),
            (None, Some((env, _))) => env,
            (None, None) => {
                return Err(format!(
                    "a run of {world} processes needs rank 0's address: --master HOST:PORT, or \
                     MASTER_ADDR and MASTER_PORT (see `flowrl run --help`, \"Several processes\")"
                ));
            }
        };
        host_port(&master)?;
        let local_rank = Self::local_rank(env, rank)?;
        Ok(Some(Cluster {
            rank,
            world,
            master,
            timeout: launch.timeout,
            fingerprint: Vec::new(),
            local_rank,
        }))
    }

    /// The process's index on its machine: torchrun's `LOCAL_RANK`, else Slurm's
    /// `SLURM_LOCALID`; above the process's rank it contradicts it (an error naming both).
    fn local_rank(
        env: &dyn Fn(&str) -> Option<String>,
        rank: usize,
    ) -> Result<Option<(usize, &'static str)>, String> {
        let var = if env("LOCAL_RANK").is_some() {
            "LOCAL_RANK"
        } else if env("SLURM_LOCALID").is_some() {
            "SLURM_LOCALID"
        } else {
            return Ok(None);
        };
        let v = env(var).unwrap_or_default();
        let local = v
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("{var}=`{v}` is not a number"))?;
        if local > rank {
            return Err(format!(
                "{var}={local} contradicts rank {rank}: a process's index on its machine is at \
                 most its rank"
            ));
        }
        Ok(Some((local, var)))
    }
}

/// The port of a `HOST:PORT` address; the error names the address.
pub fn host_port(address: &str) -> Result<u16, String> {
    let bad = |why: &str| format!("rank 0's address `{address}`: {why}; expected HOST:PORT");
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(&format!("`{port}` is not a port (1..65535)"))),
    }
}

/// The first host of a Slurm node list: `gpu-a[07-09,12],gpu-b3` → `gpu-a07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                ']' => *depth -= 1,
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, depth)| c == ',' && depth == 0)
        .map_or(list.len(), |(i, _, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((prefix, ranges)) => {
            let first_range = ranges.trim_end_matches(']').split(',').next()?;
            let start = first_range.split('-').next()?;
            format!("{prefix}{start}")
        }
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(120);

    #[test]
    fn placement_rule() {
        let run = [DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)];
        assert_eq!(node_devices(true, None, &run), run.to_vec());
        assert_eq!(node_devices(false, None, &run), vec![DeviceSpec::Cpu(0)]);
        let pinned = Some(DeviceSpec::Cpu(1));
        assert_eq!(node_devices(true, pinned, &run), vec![DeviceSpec::Cpu(1)]);
        assert_eq!(node_devices(false, pinned, &run), vec![DeviceSpec::Cpu(1)]);
        let p = Placement {
            devices: run.to_vec(),
            cluster: Cluster::from_launch(&launch(Some(1), Some(3), Some("h:3000")), &env(&[]))
                .unwrap(),
        };
        assert_eq!((p.world_replicas(), p.first_replica()), (6, 2));
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn launch(rank: Option<usize>, world: Option<usize>, master: Option<&str>) -> Launch<'_> {
        Launch {
            rank,
            world,
            master,
            timeout: T,
        }
    }

    #[test]
    fn flags_torchrun_and_slurm_name_the_processes() {
        let none = env(&[]);
        let c = Cluster::from_launch(&launch(Some(1), Some(2), Some("10.0.0.1:3000")), &none)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.rank, c.world, c.master.as_str()),
            (1, 2, "10.0.0.1:3000")
        );
        assert_eq!(
            Cluster::from_launch(&launch(None, None, None), &none),
            Ok(None)
        );
        assert_eq!(c.local_rank, None);
        let torchrun = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "h0"),
            ("MASTER_PORT", "29400"),
        ]);
        let c = Cluster::from_launch(&launch(None, None, None), &torchrun)
            .unwrap()
            .unwrap();
        assert_eq!((c.rank, c.world, c.master.as_str()), (3, 4, "h0:29400"));
        assert_eq!(c.local_rank, Some((1, "LOCAL_RANK")));
        let slurm = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu-a[07-09,12],gpu-b3"),
        ]);
        let c = Cluster::from_launch(&launch(None, None, None), &slurm)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.rank, c.world, c.master.as_str()),
            (1, 2, "gpu-a07:29500")
        );
        assert_eq!(c.local_rank, Some((1, "SLURM_LOCALID")));
        // torchrun inside a Slurm allocation numbers the processes itself.
        let both = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("MASTER_ADDR", "h"),
        ]);
        assert_eq!(
            Cluster::ranks(&launch(None, None, None), &both),
            Ok((5, 16))
        );
        assert_eq!(first_host("n1,n2").as_deref(), Some("n1"));
        assert_eq!(first_host("node[001-004]").as_deref(), Some("node001"));
    }

    #[test]
    fn contradictions_and_bad_values_name_both_sides() {
        let err =
            |l: Launch<'_>, e: &[(&str, &str)]| Cluster::from_launch(&l, &env(e)).unwrap_err();
        assert_eq!(
            err(
                launch(None, Some(2), Some("h:1")),
                &[("WORLD_SIZE", "4"), ("RANK", "0")]
            ),
            "--world 2 contradicts WORLD_SIZE=4 in the environment"
        );
        assert_eq!(
            err(launch(Some(2), Some(2), Some("h:1")), &[]),
            "--rank 2 must be below --world 2 (ranks are 0..1)"
        );
        assert_eq!(
            err(
                launch(None, None, None),
                &[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]
            ),
            "RANK=2 must be below WORLD_SIZE=2 (ranks are 0..1)"
        );
        assert_eq!(
            err(launch(None, None, None), &[("RANK", "x")]),
            "RANK=`x` is not a number"
        );
        assert!(
            err(launch(Some(0), Some(2), None), &[])
                .starts_with("a run of 2 processes needs rank 0's address")
        );
        assert_eq!(
            err(
                launch(Some(0), Some(2), Some("a:1")),
                &[("MASTER_ADDR", "b"), ("MASTER_PORT", "1")]
            ),
            "--master a:1 contradicts MASTER_ADDR and MASTER_PORT (b:1)"
        );
        assert!(
            err(launch(Some(0), Some(2), Some("h:99999")), &[]).contains("`99999` is not a port")
        );
        assert!(err(launch(Some(0), Some(2), Some(":1")), &[]).contains("no host"));
        assert_eq!(
            err(
                launch(Some(1), Some(4), Some("h:1")),
                &[("LOCAL_RANK", "2")]
            ),
            "LOCAL_RANK=2 contradicts rank 1: a process's index on its machine is at most its rank"
        );
        let zero = Launch {
            timeout: Duration::ZERO,
            ..launch(None, None, None)
        };
        assert!(
            Cluster::from_launch(&zero, &env(&[]))
                .unwrap_err()
                .contains("--collective-timeout")
        );
    }
}
