//! `advantage.gdpo`: GDPO (verl `compute_gdpo_outcome_advantage`, as verl's trainer calls it):
//! each reward component named in `gdpo_reward_keys` (a named component of the scores, e.g.
//! geo3k's `acc` and `format`) is GRPO-normalised within its uid groups on its own,
//! A_k = (c_k − mean_g)/(std_g + 1e-6); the components are summed with `gdpo_reward_weights`
//! (default all 1) and the sum is whitened over the batch: A = whiten(Σ_k w_k·A_k)·mask. See
//! `flowrl_algorithms::advantage::gdpo`. The summed score itself is not used.
//!
//! verl's trainer passes neither `norm_adv_by_std_in_grpo` nor `epsilon` to GDPO (every
//! component is std-normalised with ε = 1e-6), so `norm_adv_by_std_in_grpo` is accepted and
//! ignored, with a warning.

use anyhow::{Result, anyhow, ensure};
use flowrl_algorithms::{GdpoComponent, compute_gdpo_outcome_advantage};
use flowrl_engine::{Diagnostic, Node, ParamSchema, Params, ValidateCtx};
use serde::Deserialize;

use crate::kinds::advantage::support::{
    AdvantageKind, EstimatorNode, Ignored, advantage_inputs, with_ignored,
};

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "norm_adv_by_std_in_grpo",
        why: "verl's trainer does not pass it to compute_gdpo_outcome_advantage; every component \
              is divided by its group std",
    },
    Ignored {
        key: "gamma",
        why: "GDPO is an outcome estimator (no discounting)",
    },
    Ignored {
        key: "lam",
        why: "GDPO is an outcome estimator (no GAE)",
    },
];

/// verl's GRPO epsilon inside GDPO (the trainer never passes another).
const EPSILON: f64 = 1e-6;

#[derive(Deserialize, Params)]
struct GdpoParams {
    /// the score components to normalise apart (verl algorithm.gdpo_reward_keys)
    #[param(required)]
    gdpo_reward_keys: Vec<String>,
    /// one weight per key (verl algorithm.gdpo_reward_weights); default: all 1
    gdpo_reward_weights: Option<Vec<f64>>,
}

/// The `advantage.gdpo` kind.
pub const GDPO: AdvantageKind = AdvantageKind {
    name: "advantage.gdpo",
    doc: "GDPO advantages (verl): each named reward component GRPO-normalised per prompt uid on \
          its own, summed with weights, then whitened over the batch.",
    inputs: advantage_inputs,
    params: || with_ignored(GdpoParams::param_specs(), IGNORED, |_| None),
    ignored: IGNORED,
    checks: keys_and_weights,
    build,
};

/// At least one reward key, and no fewer weights than keys (a warning for more).
fn keys_and_weights(ctx: &ValidateCtx, _kind: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let p = match ctx.parse::<GdpoParams>() {
        Ok(p) => p,
        Err(d) => return d,
    };
    let keys = p.gdpo_reward_keys.len();
    if keys == 0 {
        out.push(ctx.error(
            "gdpo_reward_keys",
            "GDPO needs at least one reward component key (verl asserts \
             algorithm.gdpo_reward_keys)",
        ));
    }
    if let Some(w) = &p.gdpo_reward_weights {
        if w.len() < keys {
            out.push(ctx.error(
                "gdpo_reward_weights",
                format!(
                    "`gdpo_reward_weights` has {} weights for {keys} gdpo_reward_keys",
                    w.len()
                ),
            ));
        } else if w.len() > keys {
            out.push(ctx.warning(
                "gdpo_reward_weights",
                format!(
                    "`gdpo_reward_weights` has {} weights for {keys} gdpo_reward_keys: the last {} \
                     are ignored (as in verl)",
                    w.len(),
                    w.len() - keys
                ),
            ));
        }
    }
    out
}

fn build(params: &Params) -> Result<Box<dyn Node>> {
    let p: GdpoParams = params.parse()?;
    if let Some(w) = &p.gdpo_reward_weights {
        ensure!(
            w.len() >= p.gdpo_reward_keys.len(),
            "gdpo_reward_weights has {} weights for {} gdpo_reward_keys",
            w.len(),
            p.gdpo_reward_keys.len()
        );
    }
    Ok(EstimatorNode::boxed(move |_, scores, batch| {
        let columns: Vec<Vec<f64>> =
            p.gdpo_reward_keys
                .iter()
                .map(|key| {
                    let c = scores.components.get(key).ok_or_else(|| {
                    anyhow!(
                        "GDPO reward key `{key}` is not a component of the scores; they have: {}",
                        scores.components.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                })?;
                    Ok(c.iter().map(|&x| x as f64).collect())
                })
                .collect::<Result<_>>()?;
        let components: Vec<GdpoComponent> = columns
            .iter()
            .enumerate()
            .map(|(k, scores)| GdpoComponent {
                scores,
                weight: p.gdpo_reward_weights.as_ref().map_or(1.0, |w| w[k]),
            })
            .collect();
        let uid = &scores.rollouts.uid;
        Ok(compute_gdpo_outcome_advantage(
            batch,
            uid,
            Some(&components),
            EPSILON,
            true,
        )?)
    }))
}

flowrl_engine::register_node_kind!(GDPO);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::advantage::support::test_support::scores;
    use crate::kinds::reward::support::test_support::*;
    use flowrl_engine::NodeKind;

    #[test]
    fn normalises_the_named_components() {
        let mut s = scores(&[1.0, 0.1, 0.9, 0.0], &["a"; 4], &[2, 2, 2, 2]);
        s.components.insert("acc".into(), vec![1.0, 0.0, 1.0, 0.0]);
        s.components
            .insert("format".into(), vec![1.0, 1.0, 0.0, 0.0]);
        let p = params(serde_json::json!({
            "gdpo_reward_keys": ["acc", "format"],
            "gdpo_reward_weights": [1.0, 0.5],
        }));
        let mut node = GDPO.build(&p, &build_ctx("adv")).unwrap();
        let mut c = ctx("adv");
        let out = node.run(&inputs("adv", SCORES, s.clone()), &mut c);
        assert!(out.is_ok(), "{:?}", out.err());
        // acc ±0.866, format ±0.433 (group std normalised): row 0 gets both, row 3 neither;
        // the whitened sums are symmetric around 0.
        let max = metric(&c, "critic/advantages/max");
        let min = metric(&c, "critic/advantages/min");
        assert!((max + min).abs() < 1e-5 && max > 1.0, "{max} {min}");

        let p = params(serde_json::json!({"gdpo_reward_keys": ["accuracy"]}));
        let mut node = GDPO.build(&p, &build_ctx("adv")).unwrap();
        let e = node
            .run(&inputs("adv", SCORES, s), &mut ctx("adv"))
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains("they have: acc, format"), "{e}");
    }
}
