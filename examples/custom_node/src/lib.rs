//! An example flowrl plugin: node kinds defined outside flowrl's crates.
//!
//! - `reward.length_penalty` ([`length_penalty`]) consumes the built-in `Rollouts` port and
//!   produces `Scores`, so it replaces `reward.geo3k` in `graphs/grpo_vlm.toml`; docs/plugins.md
//!   ("Consuming built-in ports") shows its file verbatim.
//! - `walk.gaussian` emits a Gaussian random walk, x_t = x_{t-1} + σ·ε_t with ε_t ~ N(0, 1) drawn
//!   from the step's deterministic RNG; its position is saved in checkpoints.
//! - `walk.ema` smooths what it receives with an exponential moving average,
//!   m_t = α·x_t + (1 − α)·m_{t−1} (m_1 = x_1), reports `walk/x` and `walk/ema` and checks in its
//!   `validate` hook that α is not too small for the σ of the walk feeding it (a toy constraint
//!   with numbers, found by the walk's [`RANDOM_WALK`] capability, not by its kind name).
//!
//! Each kind declares its parameters once, as the serde struct it deserializes
//! (`#[derive(Params)]`), and each port once, as a typed [`Port`] constant.
//!
//! `src/main.rs` builds a `flowrl`-style binary with flowrl's built-in kinds plus these
//! ([`add_kinds`]); `graph.toml` uses the walk kinds.

pub mod length_penalty;

use flowrl_engine::{
    BuildContext, Capability, Diagnostic, Inputs, Node, NodeKind, Outputs, ParamSchema, ParamSpec,
    Params, Port, PortSpec, Registry, StepContext, ValidateCtx, ValueType,
};
use rand::Rng;
use serde::Deserialize;

/// A scalar per step.
pub const SCALAR: ValueType<f64> = ValueType::new("Scalar");

/// A kind that is a random walk: its parameters are [`WalkParams`] (step size `sigma`).
pub const RANDOM_WALK: Capability = Capability::new("random_walk");

const X: Port<f64> = Port::new("x", SCALAR);
const MEAN: Port<f64> = Port::new("mean", SCALAR);

pub struct GaussianWalk;

#[derive(Deserialize, Params)]
pub struct WalkParams {
    /// step standard deviation
    #[param(default = 1.0, gt = 0.0)]
    pub sigma: f64,
    /// initial position
    #[param(default = 0.0)]
    pub start: f64,
}

impl NodeKind for GaussianWalk {
    fn name(&self) -> &str {
        "walk.gaussian"
    }
    fn doc(&self) -> &str {
        "A Gaussian random walk: x_t = x_{t-1} + sigma * N(0, 1)."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        Vec::new()
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![X.spec().doc("the walk's position after this step")]
    }
    fn params(&self) -> Vec<ParamSpec> {
        WalkParams::param_specs()
    }
    fn capabilities(&self) -> Vec<Capability> {
        vec![RANDOM_WALK]
    }
    fn timing_key(&self) -> Option<&str> {
        Some("walk")
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: WalkParams = params.parse()?;
        Ok(Box::new(WalkNode {
            sigma: p.sigma,
            x: p.start,
        }))
    }
}

struct WalkNode {
    sigma: f64,
    x: f64,
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl Node for WalkNode {
    fn run(&mut self, _inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        self.x += self.sigma * normal(ctx.rng());
        Ok(Outputs::new().with(X, self.x))
    }
    fn save_state(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::json!({ "x": self.x })))
    }
    fn load_state(&mut self, state: serde_json::Value) -> anyhow::Result<()> {
        self.x = state["x"]
            .as_f64()
            .ok_or_else(|| anyhow::anyhow!("walk state has no `x`"))?;
        Ok(())
    }
}

pub struct Ema;

#[derive(Deserialize, Params)]
struct EmaParams {
    /// weight of the newest value
    #[param(default = 0.1, gt = 0.0, max = 1.0)]
    alpha: f64,
}

impl NodeKind for Ema {
    fn name(&self) -> &str {
        "walk.ema"
    }
    fn doc(&self) -> &str {
        "Exponential moving average m_t = alpha * x_t + (1 - alpha) * m_{t-1}; reports walk/x, walk/ema."
    }
    fn inputs(&self) -> Vec<PortSpec> {
        vec![X.spec()]
    }
    fn outputs(&self) -> Vec<PortSpec> {
        vec![MEAN.spec()]
    }
    fn params(&self) -> Vec<ParamSpec> {
        EmaParams::param_specs()
    }
    fn validate(&self, ctx: &ValidateCtx) -> Vec<Diagnostic> {
        // A constraint that involves a neighbour: with a very noisy walk, a tiny alpha makes the
        // average lag for ~1/alpha steps; refuse alpha < sigma / 1000.
        let alpha = match ctx.parse::<EmaParams>() {
            Ok(p) => p.alpha,
            Err(d) => return d,
        };
        let sigma = ctx
            .input(X.name())
            .filter(|n| n.has_capability(RANDOM_WALK))
            .and_then(|n| n.params().parse::<WalkParams>().ok())
            .map_or(1.0, |w| w.sigma);
        if alpha < sigma / 1000.0 {
            return vec![
                ctx.error(
                    "alpha",
                    format!(
                        "alpha = {alpha} is below sigma / 1000 = {} of the walk feeding `x`",
                        sigma / 1000.0
                    ),
                )
                .with_help("raise alpha or lower the walk's sigma"),
            ];
        }
        Vec::new()
    }
    fn build(&self, params: &Params, _ctx: &BuildContext) -> anyhow::Result<Box<dyn Node>> {
        let p: EmaParams = params.parse()?;
        Ok(Box::new(EmaNode {
            alpha: p.alpha,
            mean: None,
        }))
    }
}

struct EmaNode {
    alpha: f64,
    mean: Option<f64>,
}

impl Node for EmaNode {
    fn run(&mut self, inputs: &Inputs, ctx: &mut StepContext) -> anyhow::Result<Outputs> {
        let x = *inputs.get(X)?;
        let m = match self.mean {
            None => x,
            Some(m) => self.alpha * x + (1.0 - self.alpha) * m,
        };
        self.mean = Some(m);
        ctx.metric("walk/x", x);
        ctx.metric("walk/ema", m);
        Ok(Outputs::new().with(MEAN, m))
    }
    fn save_state(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(Some(serde_json::json!({ "mean": self.mean })))
    }
    fn load_state(&mut self, state: serde_json::Value) -> anyhow::Result<()> {
        self.mean = state["mean"].as_f64();
        Ok(())
    }
}

/// Adds this crate's kinds to `registry` (the binary passes flowrl's built-in registry).
pub fn add_kinds(registry: Registry) -> Registry {
    registry
        .with_kind(GaussianWalk)
        .with_kind(Ema)
        .with_kind(length_penalty::LengthPenaltyKind)
}
