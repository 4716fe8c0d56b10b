//! The transports of the replicas' collective operations
//! ([`crate::runtime::data_parallel::Replica`] is their one interface): shared memory between the
//! replica threads of one process ([`local`]), and TCP between the processes of a run through
//! rank 0 ([`tcp`]).

pub mod local;
pub mod tcp;
