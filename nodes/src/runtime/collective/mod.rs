//! The transports of the replicas' collective operations
//! ([`crate::runtime::data_parallel::Replica`] is their one interface): shared memory between the
//! replica threads of one process ([`local`]), and TCP between the processes of a run through
//! rank 0 ([`tcp`]). [`nccl`] loads NCCL and runs its operations on CUDA device buffers; the
//! replicas' steps do not use it yet (their gradients are summed on the host).

pub mod local;
pub mod nccl;
pub mod tcp;
