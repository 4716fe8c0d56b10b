//! What a node sees while it is built ([`BuildContext`]) and while it runs ([`StepContext`]):
//! step counters, the run seed, its device, the named resources, a deterministic RNG, metrics and
//! warnings, and the run directory.
//!
//! Random draws are derived from (run seed, step, node name) with SplitMix64 mixing, never from a
//! shared generator, so concurrency and resume never change them.

use crate::device::DeviceSpec;
use crate::resource::Resources;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// SplitMix64 finalizer (Steele, Lea & Flood 2014), used to mix seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from the run seed, a step and a tag (the node name), stable across platforms.
pub fn derive_seed(run_seed: u64, step: u64, tag: &str) -> u64 {
    let mut h = mix64(run_seed ^ 0x666C_6F77_726C_0001);
    h = mix64(h ^ step);
    for chunk in tag.as_bytes().chunks(8) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        h = mix64(h ^ u64::from_le_bytes(b));
    }
    mix64(h ^ tag.len() as u64)
}

/// Given to [`crate::NodeKind::build`].
#[derive(Clone)]
pub struct BuildContext {
    /// The node's name in the graph.
    pub node: String,
    /// The node's first device (`placement.devices[0]`).
    pub device: DeviceSpec,
    /// All devices the node runs on in this process, and the run's other processes.
    pub placement: crate::Placement,
    pub seed: u64,
    pub total_steps: u64,
    pub resources: Arc<Resources>,
    /// The run directory (`None` for `validate`-style dry builds and tests).
    pub run_dir: Option<PathBuf>,
    /// The graph the node belongs to (`None` for nodes built outside a session: tests, tools).
    pub graph: Option<Arc<crate::Graph>>,
}

impl BuildContext {
    /// A private instance of the graph's node `name`, built again from its kind and parameters,
    /// on this node's device and resources, for this node to run on inputs of its own (an
    /// `eval` scoring its responses with the training reward). Named `<this node>/<name>`.
    pub fn build_copy(&self, name: &str) -> anyhow::Result<Box<dyn crate::Node>> {
        let graph = self.graph.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "node `{}` is built outside a graph: no node `{name}` to copy",
                self.node
            )
        })?;
        let id = graph
            .node_id(name)
            .ok_or_else(|| anyhow::anyhow!("the graph has no node `{name}` to copy"))?;
        let n = &graph.nodes[id];
        let ctx = BuildContext {
            node: format!("{}/{name}", self.node),
            ..self.clone()
        };
        n.kind.build(&n.params, &ctx).map_err(|e| {
            e.context(format!(
                "building a copy of node `{name}` (kind `{}`)",
                n.kind.name()
            ))
        })
    }

    /// A resource by name, downcast to its Rust type.
    pub fn resource<T: std::any::Any + Send + Sync>(&self, name: &str) -> anyhow::Result<Arc<T>> {
        self.resources.get::<T>(name)
    }

    /// A seed for one-time initialisation, derived from (run seed, node name).
    pub fn init_seed(&self) -> u64 {
        derive_seed(self.seed, u64::MAX, &self.node)
    }
}

/// A text or a picture a node logs for the run's trackers (TensorBoard), beside its metrics.
#[derive(Clone, Debug)]
pub enum Media {
    /// Markdown.
    Text { tag: String, markdown: String },
    /// An RGB picture: a PNG file's bytes and its size.
    Image {
        tag: String,
        png: Vec<u8>,
        width: u32,
        height: u32,
    },
}

/// Given to [`crate::Node::run`] for one step.
pub struct StepContext {
    pub(crate) node: String,
    pub(crate) step: u64,
    pub(crate) total_steps: u64,
    pub(crate) seed: u64,
    pub(crate) device: DeviceSpec,
    pub(crate) resources: Arc<Resources>,
    pub(crate) run_dir: Option<PathBuf>,
    pub(crate) rng: Option<StdRng>,
    pub(crate) metrics: Vec<(String, f64)>,
    pub(crate) warnings: Vec<String>,
    /// The nodes this node repeats (its `repeat` list), when it has any.
    pub(crate) repeat: Option<crate::repeat::Repeat>,
    /// Running in the pass before the first step ([`crate::Node::before_train`]).
    pub(crate) before_train: bool,
    /// Whether a tracker takes [`Media`] this run.
    pub(crate) wants_media: bool,
    pub(crate) media: Vec<Media>,
}

impl StepContext {
    /// A context for running a node outside the engine (tests, benchmarks).
    pub fn new(
        node: impl Into<String>,
        step: u64,
        total_steps: u64,
        seed: u64,
        device: DeviceSpec,
        resources: Arc<Resources>,
    ) -> Self {
        StepContext {
            node: node.into(),
            step,
            total_steps,
            seed,
            device,
            resources,
            run_dir: None,
            rng: None,
            metrics: Vec::new(),
            warnings: Vec::new(),
            repeat: None,
            before_train: false,
            wants_media: false,
            media: Vec::new(),
        }
    }

    /// 0-based index of the current step (0 in the pass before the first step).
    pub fn step(&self) -> u64 {
        self.step
    }
    /// Whether this is the pass before the first step ([`crate::Node::before_train`]), which
    /// evaluates the initial weights.
    pub fn is_before_train(&self) -> bool {
        self.before_train
    }
    /// Number of steps of the run.
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }
    /// Whether this is the run's last step (never in the pass before the first step).
    pub fn is_last_step(&self) -> bool {
        !self.before_train && self.step + 1 == self.total_steps
    }
    pub fn seed(&self) -> u64 {
        self.seed
    }
    pub fn node_name(&self) -> &str {
        &self.node
    }
    pub fn device(&self) -> DeviceSpec {
        self.device
    }
    pub fn run_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref()
    }

    pub fn resource<T: std::any::Any + Send + Sync>(&self, name: &str) -> anyhow::Result<Arc<T>> {
        self.resources.get::<T>(name)
    }

    /// This node's generator for this step, seeded from (run seed, step, node name). Successive
    /// calls within one step continue the same stream. The pass before the first step draws
    /// from a stream of its own.
    pub fn rng(&mut self) -> &mut StdRng {
        let seed = derive_seed(self.seed, self.stream(), &self.node);
        self.rng.get_or_insert_with(|| StdRng::seed_from_u64(seed))
    }

    /// A seed for (run seed, step, node name, tag), e.g. to seed a backend's own generator.
    pub fn derive_seed(&self, tag: &str) -> u64 {
        derive_seed(self.seed, self.stream(), &format!("{}/{tag}", self.node))
    }

    /// The step index random draws derive from: the step's, or for the pass before the first
    /// step one no step has (`u64::MAX` is [`BuildContext::init_seed`]'s).
    fn stream(&self) -> u64 {
        if self.before_train {
            u64::MAX - 1
        } else {
            self.step
        }
    }

    /// Records a metric for this step (use verl's names: `actor/pg_loss`, `critic/score/mean`, ...).
    pub fn metric(&mut self, name: impl Into<String>, value: f64) {
        self.metrics.push((name.into(), value));
    }

    /// Whether the run has a tracker for texts and pictures (`[run] tracking` with
    /// `tensorboard`): a node can skip building them otherwise.
    pub fn wants_media(&self) -> bool {
        self.wants_media
    }

    /// Logs markdown for the trackers at this step (nothing without one).
    pub fn log_text(&mut self, tag: impl Into<String>, markdown: impl Into<String>) {
        if self.wants_media {
            self.media.push(Media::Text {
                tag: tag.into(),
                markdown: markdown.into(),
            });
        }
    }

    /// Logs a PNG picture (RGB) for the trackers at this step (nothing without one).
    pub fn log_image(&mut self, tag: impl Into<String>, png: Vec<u8>, width: u32, height: u32) {
        if self.wants_media {
            self.media.push(Media::Image {
                tag: tag.into(),
                png,
                width,
                height,
            });
        }
    }

    /// Logs a warning (shown on the console and kept in the run log).
    pub fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }

    /// The nodes this node repeats within the step (its `repeat` list; see [`crate::Repeat`]).
    /// An error when the graph gives it none.
    pub fn repeat(&mut self) -> anyhow::Result<&mut crate::Repeat> {
        let node = &self.node;
        self.repeat.as_mut().ok_or_else(|| {
            anyhow::anyhow!("node `{node}` repeats no nodes: its graph table has no `repeat` list")
        })
    }

    /// Whether the graph gives this node nodes to repeat.
    pub fn has_repeat(&self) -> bool {
        self.repeat.is_some()
    }

    pub fn metrics(&self) -> &[(String, f64)] {
        &self.metrics
    }
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn rng_depends_on_seed_step_and_node_only() {
        let res = Arc::new(Resources::default());
        let draw = |node: &str, step: u64, seed: u64| {
            let mut c = StepContext::new(node, step, 10, seed, DeviceSpec::Cpu(0), res.clone());
            c.rng().random::<u64>()
        };
        assert_eq!(draw("a", 3, 7), draw("a", 3, 7));
        assert_ne!(draw("a", 3, 7), draw("b", 3, 7));
        assert_ne!(draw("a", 3, 7), draw("a", 4, 7));
        assert_ne!(draw("a", 3, 7), draw("a", 3, 8));
        // Stable across versions and platforms: a pinned value.
        assert_eq!(derive_seed(7, 3, "rollout"), derive_seed(7, 3, "rollout"));
        assert_ne!(derive_seed(7, 3, "ab"), derive_seed(7, 3, "ab\0"));
    }
}
