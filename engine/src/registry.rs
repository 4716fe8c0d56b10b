//! The registry of node kinds and resource kinds.
//!
//! Built-in kinds register themselves at link time with [`register_node_kind!`] /
//! [`register_resource_kind!`] (through `inventory`); [`Registry::builtin`] collects them. A library
//! user builds an engine with extra kinds explicitly: `Registry::builtin().with_kind(MyKind)`.

use crate::node::NodeKind;
use crate::resource::ResourceKind;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A node kind submitted with [`register_node_kind!`].
pub struct NodeKindRegistration {
    pub make: fn() -> Arc<dyn NodeKind>,
}

/// A resource kind submitted with [`register_resource_kind!`].
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
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Every kind registered with the macros in the crates linked into this binary.
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
}
