//! Named reward functions and their weighted combination.
//!
//! A [`RewardFunction`] scores one (response, ground truth) pair and reports named components
//! (geo3k reports `acc` and `format`). [`CombinedReward`] computes Σ wᵢ·scoreᵢ and reports
//! every component's unweighted score under its name (and its sub-components as
//! `name/sub`), so a node can log each one as a metric.

use crate::error::{AlgoError, Result};

use super::geo3k::geo3k_score;
use super::simple::{exact_match_reward, format_only_reward};

/// A score and its named components.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardScore {
    /// The scalar reward.
    pub score: f64,
    /// Named parts (e.g. `acc`, `format`), for logging.
    pub components: Vec<(String, f64)>,
}

/// A rule-based reward over strings.
pub trait RewardFunction: Send + Sync {
    /// Short name (used as metric key).
    fn name(&self) -> &str;
    /// Scores one response against its ground truth.
    fn score(&self, response: &str, ground_truth: &str) -> RewardScore;
}

/// The built-in reward functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinReward {
    /// geo3k: 0.9·acc + 0.1·format (components `acc`, `format`).
    Geo3k,
    /// Exact string match of the boxed answer.
    ExactMatch,
    /// The think/boxed format only.
    Format,
}

impl BuiltinReward {
    /// Parses `geo3k`, `exact_match`, `format`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "geo3k" => Ok(Self::Geo3k),
            "exact_match" => Ok(Self::ExactMatch),
            "format" => Ok(Self::Format),
            _ => Err(AlgoError::Unknown {
                kind: "reward function",
                name: name.to_string(),
                expected: "geo3k, exact_match, format".into(),
            }),
        }
    }
}

impl RewardFunction for BuiltinReward {
    fn name(&self) -> &str {
        match self {
            Self::Geo3k => "geo3k",
            Self::ExactMatch => "exact_match",
            Self::Format => "format",
        }
    }

    fn score(&self, response: &str, ground_truth: &str) -> RewardScore {
        match self {
            Self::Geo3k => {
                let s = geo3k_score(response, ground_truth);
                RewardScore {
                    score: s.score,
                    components: vec![("acc".into(), s.acc), ("format".into(), s.format)],
                }
            }
            Self::ExactMatch => RewardScore {
                score: exact_match_reward(response, ground_truth),
                components: Vec::new(),
            },
            Self::Format => RewardScore {
                score: format_only_reward(response),
                components: Vec::new(),
            },
        }
    }
}

/// Σ wᵢ·rᵢ over weighted reward functions.
pub struct CombinedReward {
    parts: Vec<(f64, Box<dyn RewardFunction>)>,
}

impl CombinedReward {
    /// Builds a combination; weights must be finite and there must be at least one part.
    pub fn new(parts: Vec<(f64, Box<dyn RewardFunction>)>) -> Result<Self> {
        if parts.is_empty() {
            return Err(AlgoError::Empty(
                "a combined reward needs at least one component".into(),
            ));
        }
        for (w, f) in &parts {
            if !w.is_finite() {
                return Err(AlgoError::InvalidParameter(format!(
                    "weight of reward {:?} must be finite, got {w}",
                    f.name()
                )));
            }
        }
        Ok(Self { parts })
    }
}

impl RewardFunction for CombinedReward {
    fn name(&self) -> &str {
        "combined"
    }

    fn score(&self, response: &str, ground_truth: &str) -> RewardScore {
        let mut total = 0.0;
        let mut components = Vec::new();
        for (w, f) in &self.parts {
            let s = f.score(response, ground_truth);
            total += w * s.score;
            components.push((f.name().to_string(), s.score));
            for (k, v) in s.components {
                components.push((format!("{}/{k}", f.name()), v));
            }
        }
        RewardScore {
            score: total,
            components,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combination_weights_and_logs_components() {
        let c = CombinedReward::new(vec![
            (0.5, Box::new(BuiltinReward::Geo3k)),
            (2.0, Box::new(BuiltinReward::ExactMatch)),
        ])
        .unwrap();
        let s = c.score("<think>t</think> \\boxed{0.5}", "\\frac{1}{2}");
        // geo3k = 1.0 (acc 1, format 1); exact match = 0.
        assert_eq!(s.score, 0.5);
        assert_eq!(
            s.components,
            vec![
                ("geo3k".to_string(), 1.0),
                ("geo3k/acc".to_string(), 1.0),
                ("geo3k/format".to_string(), 1.0),
                ("exact_match".to_string(), 0.0),
            ]
        );
    }

    #[test]
    fn bad_combinations_are_errors() {
        assert!(CombinedReward::new(Vec::new()).is_err());
        assert!(CombinedReward::new(vec![(f64::NAN, Box::new(BuiltinReward::Format))]).is_err());
        assert!(BuiltinReward::from_name("nope").is_err());
    }
}
