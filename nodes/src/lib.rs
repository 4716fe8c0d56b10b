//! flowrl-nodes: the built-in node kinds (one kind per file) and the model/optimizer resources.
//!
//! Values on edges are defined in [`values`]; node kinds register with the engine's registry.
//!
//! A binary gets these kinds with [`register_builtin`] (or [`builtin_registry`]); a plugin binary
//! (the CLI with its own kinds added) is one line, [`plugin_main!`], which also sets the binaries'
//! allocator ([`allocator`]). Calling into this crate is what links it: a binary that only names
//! `flowrl_engine::Registry::builtin()` has no built-in kinds at all.
//!
//! The tree:
//! - [`kinds`]: the node kinds, a folder per family (`kinds/reward/geo3k.rs` is `reward.geo3k`).
//!   The main job's are `rollout`, `logprob`, `update.ppo`, `update.sft`, `eval` and the critic's
//!   `value` and `update.critic`.
//! - [`resources`]: the `model` resource kind ([`resources::model`]; `value_head = true` makes a
//!   value model, PPO's critic).
//! - [`runtime`]: how nodes run: the burn [`backend`] of a device, the [`data_parallel`] replicas,
//!   the collective operations between them ([`runtime::collective`]), the binaries'
//!   [`allocator`].
//! - [`train`]: what the model-running kinds share: [`train::sequences`] (response log-probs in
//!   chunks), [`train::micro_batches`], optimizer parameters, the data-parallel step
//!   ([`train::replicated`]),
//!   [`train::optim`] (AdamW, clipping, schedules with PyTorch/verl semantics).

pub mod kinds;
pub mod resources;
pub mod runtime;
pub mod sizing;
pub mod tools;
pub mod train;
pub mod values;

// The port value types, at the root for plugins (`flowrl_nodes::RolloutBatch`).
pub use values::{
    AdvantageBatch, PromptBatch, RolloutBatch, ScoreBatch, TokenLogProbs, TokenMatrix, TokenValues,
};

use flowrl_engine::Registry;

/// Adds every built-in node kind (`rollout`, `reward.*`, `exec`, …) and resource kind (`model`)
/// to `registry`; a kind of the same name already there is replaced.
///
/// The kinds register themselves with `flowrl_engine::register_node_kind!` (inventory); calling
/// this function links this crate into the binary, which is what makes those registrations part
/// of it. Panics if they are missing anyway (a platform where link-time registration fails).
pub fn register_builtin(registry: &mut Registry) {
    let builtin = Registry::builtin();
    assert!(
        builtin.kind(kinds::exec::KIND).is_some() && builtin.resource_kinds().next().is_some(),
        "flowrl-nodes is linked but its kinds did not register (inventory); this platform needs \
         explicit registration"
    );
    for kind in builtin.kinds() {
        registry.add_kind_arc(kind.clone());
    }
    for kind in builtin.resource_kinds() {
        registry.add_resource_kind_arc(kind.clone());
    }
}

/// A registry with every built-in kind ([`register_builtin`]) and this machine's device probe
/// ([`runtime::machine::MachineProbe`]).
pub fn builtin_registry() -> Registry {
    let mut r = Registry::new();
    register_builtin(&mut r);
    r.with_device_probe(runtime::machine::MachineProbe)
}

/// The `main` of a plugin binary, for [`plugin_main!`] (or for a `main` of your own after
/// [`global_allocator!`]): tells the allocator to keep freed memory, builds the built-in registry,
/// lets `add` add the plugin's kinds, and runs the engine's CLI (`run`, `validate`, `graph`,
/// `nodes`, `plot`, `plan`) with the process arguments.
pub fn main_with_builtin_and(add: impl FnOnce(Registry) -> Registry) -> std::process::ExitCode {
    runtime::allocator::keep_freed_memory();
    flowrl_engine::cli::main_with(add(builtin_registry()))
}

/// Declares flowrl's allocator (mimalloc, see [`allocator`]) as the binary's global allocator.
/// Write it once at the top level of a binary's `main.rs`; [`plugin_main!`] includes it.
#[macro_export]
macro_rules! global_allocator {
    () => {
        #[global_allocator]
        static FLOWRL_ALLOCATOR: $crate::runtime::allocator::MiMalloc =
            $crate::runtime::allocator::MiMalloc;
    };
}

/// A plugin binary's whole `main.rs`: the engine's CLI with every built-in kind, the kinds that
/// `$add` (a `fn(Registry) -> Registry` or closure) adds, and flowrl's allocator:
///
/// ```ignore
/// flowrl_nodes::plugin_main!(|registry| registry.with_kind(my_crate::LengthPenalty));
/// ```
#[macro_export]
macro_rules! plugin_main {
    ($add:expr) => {
        $crate::global_allocator!();

        fn main() -> ::std::process::ExitCode {
            $crate::main_with_builtin_and($add)
        }
    };
}
