//! Resources: named, shared, stateful things that nodes refer to (models, optimizers).
//!
//! A graph declares them in sections such as `[models.policy]`; the section name (`models`)
//! selects a registered [`ResourceKind`] (whose name is e.g. `"model"`), whose parameter schema
//! checks the section's keys exactly as node parameters are checked. Nodes refer to resources through
//! [`crate::ParamType::Resource`] parameters, which the compiler resolves (unknown names get a
//! did-you-mean). A resource may refer to another one (`[models.reference] from = "policy"`); the
//! engine builds them in dependency order. Checkpoints call each kind's `save`/`load` hooks.

use crate::context::BuildContext;
use crate::diagnostic::Diagnostic;
use crate::node::ValidateCtx;
use crate::params::{ParamSpec, Params};
use crate::plan::{PlanCtx, ResourcePlan};
use anyhow::{Context as _, anyhow};
use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A built resource: the value nodes share.
pub type ResourceValue = Arc<dyn Any + Send + Sync>;

/// A kind of resource, e.g. `model` for `[models.*]` sections.
pub trait ResourceKind: Send + Sync {
    /// The kind's name, used by `ParamType::Resource("model")`.
    fn name(&self) -> &str;
    /// The plural section it is declared in (`"models"` for `[models.policy]`).
    fn section(&self) -> &str;
    fn doc(&self) -> &str;
    fn params(&self) -> Vec<ParamSpec>;
    /// Constraints on the parameters (e.g. the model directory exists), reported with spans.
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        let _ = ctx;
        Vec::new()
    }
    /// What the resource holds once built, and the shape the node kinds using it size their
    /// buffers with (see [`crate::plan`]). `None` (the default): the resource is unknown to the
    /// plan.
    fn footprint(&self, ctx: &PlanCtx) -> Option<ResourcePlan> {
        let _ = ctx;
        None
    }
    /// Builds the resource. Resources it refers to are already in `ctx.resources`; `ctx.node` is
    /// the resource's name.
    fn build(&self, params: &Params, ctx: &BuildContext) -> anyhow::Result<ResourceValue>;
    /// Writes the resource's state into `dir` (created, empty) for a checkpoint.
    fn save(&self, value: &(dyn Any + Send + Sync), dir: &Path) -> anyhow::Result<()> {
        let _ = (value, dir);
        Ok(())
    }
    /// Restores the state written by [`ResourceKind::save`] (the value is shared: use interior
    /// mutability).
    fn load(&self, value: &(dyn Any + Send + Sync), dir: &Path) -> anyhow::Result<()> {
        let _ = (value, dir);
        Ok(())
    }
}

/// One built resource with its kind.
#[derive(Clone)]
pub struct ResourceEntry {
    pub kind: Arc<dyn ResourceKind>,
    pub value: ResourceValue,
}

/// The built resources of a run, by name.
#[derive(Clone, Default)]
pub struct Resources {
    entries: BTreeMap<String, ResourceEntry>,
}

impl Resources {
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        kind: Arc<dyn ResourceKind>,
        value: ResourceValue,
    ) {
        self.entries
            .insert(name.into(), ResourceEntry { kind, value });
    }

    /// The resource `name` downcast to `T`; errors name the resource and both types.
    pub fn get<T: Any + Send + Sync>(&self, name: &str) -> anyhow::Result<Arc<T>> {
        let e = self
            .entries
            .get(name)
            .with_context(|| format!("no resource named `{name}`"))?;
        e.value.clone().downcast::<T>().map_err(|_| {
            anyhow!(
                "resource `{name}` (kind `{}`) is not a `{}`",
                e.kind.name(),
                std::any::type_name::<T>()
            )
        })
    }

    pub fn entry(&self, name: &str) -> Option<&ResourceEntry> {
        self.entries.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &ResourceEntry)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
}
