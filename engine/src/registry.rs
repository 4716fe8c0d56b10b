//! The registry of node kinds and resource kinds.
//!
//! Kinds register themselves at link time with [`register_node_kind!`](crate::register_node_kind) /
//! [`register_resource_kind!`](crate::register_resource_kind) (through `inventory`); [`Registry::builtin`] collects them from the
//! crates linked into the binary. A crate is linked only when the binary uses something of it, so
//! a binary that wants flowrl's built-in kinds asks for them explicitly:
//! `flowrl_nodes::register_builtin(&mut registry)` (or `flowrl_nodes::builtin_registry()`), then
//! adds its own with [`Registry::with_kind`]. The compiler's unknown-section and unknown-kind
//! diagnostics say so when a registry has no resource kinds at all ([`Registry::lacks_builtin`]).

use crate::node::NodeKind;
use crate::plan::DeviceProbe;
use crate::resource::ResourceKind;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A node kind submitted with [`register_node_kind!`](crate::register_node_kind).
pub struct NodeKindRegistration {
    pub make: fn() -> Arc<dyn NodeKind>,
}

/// A resource kind submitted with [`register_resource_kind!`](crate::register_resource_kind).
pub struct ResourceKindRegistration {
    pub make: fn() -> Arc<dyn ResourceKind>,
}

inventory::collect!(NodeKindRegistration);
inventory::collect!(ResourceKindRegistration);

/// Registers a node kind at link time: `register_node_kind!(Rollout);` (any expression that
/// builds the kind).
#[macro_export]
macro_rules! register_node_kind {
    ($kind:expr) => {
        $crate::inventory::submit! {
            $crate::NodeKindRegistration { make: || ::std::sync::Arc::new($kind) }
        }
    };
}

/// Registers a resource kind at link time: `register_resource_kind!(ModelKind);`.
#[macro_export]
macro_rules! register_resource_kind {
    ($kind:expr) => {
        $crate::inventory::submit! {
            $crate::ResourceKindRegistration { make: || ::std::sync::Arc::new($kind) }
        }
    };
}

/// The node kinds and resource kinds an engine knows.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<String, Arc<dyn NodeKind>>,
    resource_kinds: BTreeMap<String, Arc<dyn ResourceKind>>,
    /// Measures this machine's devices for the plan (set by the crate that links the backends).
    device_probe: Option<Arc<dyn DeviceProbe>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Every kind registered with the macros in the crates linked into this binary (none of
    /// flowrl's built-in kinds unless the binary uses `flowrl_nodes`: see the module doc).
    pub fn builtin() -> Self {
        let mut r = Registry::new();
        for reg in inventory::iter::<NodeKindRegistration> {
            r.add_kind_arc((reg.make)());
        }
        for reg in inventory::iter::<ResourceKindRegistration> {
            r.add_resource_kind_arc((reg.make)());
        }
        r
    }

    /// Adds (or replaces) a node kind.
    pub fn with_kind(mut self, kind: impl NodeKind + 'static) -> Self {
        self.add_kind_arc(Arc::new(kind));
        self
    }

    /// Adds (or replaces) a resource kind.
    pub fn with_resource_kind(mut self, kind: impl ResourceKind + 'static) -> Self {
        self.add_resource_kind_arc(Arc::new(kind));
        self
    }

    /// Sets what measures this machine's devices for `flowrl plan` and the checks before a run.
    pub fn with_device_probe(mut self, probe: impl DeviceProbe + 'static) -> Self {
        self.device_probe = Some(Arc::new(probe));
        self
    }

    pub fn device_probe(&self) -> Option<&Arc<dyn DeviceProbe>> {
        self.device_probe.as_ref()
    }

    pub fn add_kind_arc(&mut self, kind: Arc<dyn NodeKind>) {
        self.kinds.insert(kind.name().to_string(), kind);
    }

    pub fn add_resource_kind_arc(&mut self, kind: Arc<dyn ResourceKind>) {
        self.resource_kinds.insert(kind.name().to_string(), kind);
    }

    pub fn kind(&self, name: &str) -> Option<&Arc<dyn NodeKind>> {
        self.kinds.get(name)
    }

    /// Node kinds sorted by name.
    pub fn kinds(&self) -> impl Iterator<Item = &Arc<dyn NodeKind>> {
        self.kinds.values()
    }

    pub fn resource_kind(&self, name: &str) -> Option<&Arc<dyn ResourceKind>> {
        self.resource_kinds.get(name)
    }

    /// The resource kind declared in section `section` (`"models"`).
    pub fn resource_kind_for_section(&self, section: &str) -> Option<&Arc<dyn ResourceKind>> {
        self.resource_kinds
            .values()
            .find(|k| k.section() == section)
    }

    pub fn resource_kinds(&self) -> impl Iterator<Item = &Arc<dyn ResourceKind>> {
        self.resource_kinds.values()
    }

    /// Whether this registry looks like one built without flowrl's built-in kinds: it has no
    /// resource kind (the built-in `model` kind is one).
    pub fn lacks_builtin(&self) -> bool {
        self.resource_kinds.is_empty()
    }
}

/// The help of a diagnostic about an unknown section or kind in a registry that
/// [`Registry::lacks_builtin`].
pub const NO_BUILTIN_HELP: &str = "no built-in kinds are registered in this binary (it has no \
    resource kinds, so no `[models.*]` either); a plugin binary gets them with \
    `flowrl_nodes::plugin_main!(...)` or `flowrl_nodes::register_builtin(&mut registry)` before \
    adding its own kinds (docs/plugins.md, \"Register\")";
