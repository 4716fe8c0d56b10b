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
