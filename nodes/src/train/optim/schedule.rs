//! Learning-rate schedules with linear warm-up, as verl's actor optimizer
//! (`verl/utils/torch_functional.py`: `get_constant_schedule_with_warmup`,
//! `get_cosine_schedule_with_warmup`).
//!
//! The factor at optimizer-schedule step `s` (0-based training step; verl steps the scheduler once
//! per `update_actor` call and logs `actor/lr` before stepping it):
//!
//! ```text
//! warm-up (s < W):  s / max(1, W)
//! constant:         1
//! cosine:           p = (s − W) / max(1, S − W)
//!                   min_ratio + (1 − min_ratio) · ½ · (1 + cos(π · 2 · cycles · p))   (cycles = 0.5)
//! ```
//!
//! `lr(s) = base_lr · factor(s)`. With W = 0 the first step already uses the full rate.

use flowrl_engine::ParamChoice;

/// The shape after warm-up (the `lr_schedule` parameter: `"constant"`, `"cosine"`).
#[derive(Debug, Clone, Copy, PartialEq, ParamChoice)]
pub enum WarmupStyle {
    Constant,
    Cosine,
}

/// A learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub base_lr: f64,
    /// W: warm-up steps.
    pub warmup_steps: u64,
    /// S: total training steps (cosine only).
    pub total_steps: u64,
    pub style: WarmupStyle,
    /// Floor of the cosine, as a fraction of `base_lr` (verl `min_lr_ratio`, default 0).
    pub min_lr_ratio: f64,
    /// Cosine cycles (verl `num_cycles`, default 0.5: one half-period from 1 down to the floor).
    pub num_cycles: f64,
}

impl LrSchedule {
    /// A constant rate without warm-up.
    pub fn constant(base_lr: f64) -> Self {
        Self {
            base_lr,
            warmup_steps: 0,
            total_steps: 1,
            style: WarmupStyle::Constant,
            min_lr_ratio: 0.0,
            num_cycles: 0.5,
        }
    }

    /// The multiplier of `base_lr` at step `s` (see the module doc).
    pub fn factor(&self, s: u64) -> f64 {
        let w = self.warmup_steps;
        if s < w {
            return s as f64 / (w.max(1)) as f64;
        }
        match self.style {
            WarmupStyle::Constant => 1.0,
            WarmupStyle::Cosine => {
                let progress = (s - w) as f64 / (self.total_steps.saturating_sub(w)).max(1) as f64;
                let x = (std::f64::consts::PI * 2.0 * self.num_cycles * progress).cos();
                self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + x)
            }
        }
    }

    /// The learning rate at step `s`.
    pub fn lr(&self, s: u64) -> f64 {
        self.base_lr * self.factor(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_with_warmup_is_linear_then_flat() {
        let s = LrSchedule {
            warmup_steps: 4,
            ..LrSchedule::constant(1e-6)
        };
        let lrs: Vec<f64> = (0..6).map(|i| s.lr(i) / 1e-6).collect();
        assert_eq!(lrs, vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.0]);
        assert_eq!(
            LrSchedule::constant(2.0).lr(0),
            2.0,
            "no warm-up: full rate at once"
        );
    }

    #[test]
    fn cosine_goes_from_one_to_the_floor() {
        let s = LrSchedule {
            base_lr: 1.0,
            warmup_steps: 2,
            total_steps: 12,
            style: WarmupStyle::Cosine,
            min_lr_ratio: 0.1,
            num_cycles: 0.5,
        };
        assert_eq!(s.lr(1), 0.5);
        assert!((s.lr(2) - 1.0).abs() < 1e-12);
        // Halfway through the decay: cos(π/2) = 0 → 0.1 + 0.9 · 0.5.
        assert!((s.lr(7) - 0.55).abs() < 1e-12);
        assert!((s.lr(12) - 0.1).abs() < 1e-12);
    }
}
