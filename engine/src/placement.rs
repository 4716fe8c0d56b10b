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

/// The processes of a multi-process run (`flowrl run --rank R --world W --orchestrator ADDR`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cluster {
    /// This process, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
    /// The collective orchestrator's address, `ws://host:port` (`flowrl orchestrator --port P`).
    pub orchestrator: String,
    /// The address other processes reach this one at, `ws://host:port`.
    pub node_address: String,
    /// The port of this process's tensor service (the port of `node_address`).
    pub data_port: u16,
    /// How long a collective operation waits for the other processes before the run stops with
    /// an error (a process that died or never joined).
    pub timeout: Duration,
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

impl Cluster {
    /// A checked cluster from the command-line flags (`--rank`, `--world`, `--orchestrator`,
    /// `--node-address`, `--collective-timeout`): `None` for a one-process run (the address flags
    /// are then ignored). The error names the flag at fault.
    pub fn from_flags(
        rank: usize,
        world: usize,
        orchestrator: Option<&str>,
        node_address: Option<&str>,
        timeout: Duration,
    ) -> Result<Option<Cluster>, String> {
        if world == 0 {
            return Err("--world must be at least 1".into());
        }
        if rank >= world {
            return Err(format!(
                "--rank {rank} must be below --world {world} (ranks are 0..{})",
                world - 1
            ));
        }
        if timeout.is_zero() {
            return Err("--collective-timeout must be at least 1 second".into());
        }
        if world == 1 {
            return Ok(None);
        }
        let need = |flag: &str, v: Option<&str>| {
            v.map(str::to_string).ok_or_else(|| {
                format!(
                    "--world {world} needs {flag} ws://HOST:PORT (see `flowrl run --help`, \"Several processes\")"
                )
            })
        };
        let orchestrator = need("--orchestrator", orchestrator)?;
        let node_address = need("--node-address", node_address)?;
        ws_port("--orchestrator", &orchestrator)?;
        let data_port = ws_port("--node-address", &node_address)?;
        Ok(Some(Cluster {
            rank,
            world,
            orchestrator,
            node_address,
            data_port,
            timeout,
        }))
    }
}

/// The port of a `ws://HOST:PORT` address (a trailing `/` is allowed); the error names `flag`.
pub fn ws_port(flag: &str, address: &str) -> Result<u16, String> {
    let bad = |why: &str| format!("{flag} `{address}`: {why}; expected ws://HOST:PORT");
    let rest = address
        .strip_prefix("ws://")
        .ok_or_else(|| bad("not a ws:// address"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(&format!("`{port}` is not a port (1..65535)"))),
    }
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
            cluster: Cluster::from_flags(1, 3, Some("ws://h:3000"), Some("ws://h:3001"), T)
                .unwrap(),
        };
        assert_eq!((p.world_replicas(), p.first_replica()), (6, 2));
    }

    #[test]
    fn cluster_flags_are_checked() {
        let c = Cluster::from_flags(
            1,
            2,
            Some("ws://10.0.0.1:3000"),
            Some("ws://10.0.0.2:3011/"),
            T,
        )
        .unwrap()
        .unwrap();
        assert_eq!((c.rank, c.world, c.data_port), (1, 2, 3011));
        // One process: the address flags are ignored.
        assert_eq!(
            Cluster::from_flags(0, 1, Some("nonsense"), None, T),
            Ok(None)
        );
        let err = |r, w, o, n| Cluster::from_flags(r, w, o, n, T).unwrap_err();
        assert_eq!(
            err(2, 2, None, None),
            "--rank 2 must be below --world 2 (ranks are 0..1)"
        );
        assert_eq!(err(0, 0, None, None), "--world must be at least 1");
        assert!(err(0, 2, None, Some("ws://h:1")).starts_with("--world 2 needs --orchestrator"));
        assert!(err(0, 2, Some("ws://h:1"), None).starts_with("--world 2 needs --node-address"));
        assert_eq!(
            err(0, 2, Some("http://h:1"), Some("ws://h:2")),
            "--orchestrator `http://h:1`: not a ws:// address; expected ws://HOST:PORT"
        );
        assert_eq!(
            err(0, 2, Some("ws://h:1"), Some("ws://h:99999")),
            "--node-address `ws://h:99999`: `99999` is not a port (1..65535); expected ws://HOST:PORT"
        );
        assert!(err(0, 2, Some("ws://:1"), Some("ws://h:2")).contains("no host"));
        assert!(
            Cluster::from_flags(0, 1, None, None, Duration::ZERO)
                .unwrap_err()
                .contains("--collective-timeout")
        );
    }
}
