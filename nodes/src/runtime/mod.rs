//! How the nodes run: on which burn backend ([`backend`]), over how many replicas
//! ([`data_parallel`]) and the collective operations between them ([`collective`]), and, for the
//! binaries, with which memory allocator ([`allocator`]); what the devices hold and compute
//! ([`machine`]).

pub mod allocator;
pub mod backend;
pub mod collective;
pub mod data_parallel;
pub mod machine;
