//! Data parallelism at the node level: the data-parallel node kinds (`rollout`, `logprob`,
//! `update.ppo`, `update.sft`) built with several CPU replicas in one process give what one
//! replica gives — the same responses, the same log-probs, and the same update (gradients
//! all-reduced through burn-collective) within float tolerance.

mod common;

use common::{assert_same_steps, build};

#[test]
fn replicas_in_one_process_match_one_device() {
    // Adam's steps are ≈ lr = 1e-3 per weight; reduction-order noise stays far below that.
    assert_same_steps(
        &mut build(1),
        &mut build(3),
        "3 replicas vs 1",
        1e-4,
        1e-3,
        1e-4,
    );
}
