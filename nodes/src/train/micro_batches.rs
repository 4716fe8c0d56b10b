//! How the `logprob`, `value`, `update.ppo` and `update.critic` nodes split their rows into micro-batches
//! (one forward, or forward and backward, each): a fixed number of rows (`micro_batch_size`,
//! verl's `*_micro_batch_size_per_gpu`) or a token budget (`max_tokens_per_micro_batch`, verl's
//! `use_dynamic_bsz` with `ppo_max_token_len_per_gpu` / `log_prob_max_token_len_per_gpu`).
//!
//! A token budget packs rows by their real lengths, prompt + response tokens (no padding), as
//! verl's `rearrange_micro_batches` (`verl/utils/seqlen_balancing.py`): the fewest micro-batches
//! `k = ⌈Σ lengths / budget⌉`, the rows split into `k` sets of balanced length sums by the
//! Karmarkar–Karp largest differencing method ([`balanced_partitions`], verl's
//! `get_seqlen_balanced_partitions`). verl stops there, so one of its micro-batches can exceed
//! the budget by a little; here `k` grows until every micro-batch holding more than one row fits.
//! A row longer than the budget gets a micro-batch of its own, and the node warns
//! ([`MicroBatching::warn_oversized`]; verl asserts instead). Rows keep their order
//! inside a micro-batch and micro-batches are ordered by their first row, so the split is a
//! function of the lengths alone: deterministic, and the same on every run.
//!
//! Only which rows go together changes; a micro-batch is still laid out padded
//! ([`crate::train::sequences::SequenceBatch`]: prompts left-padded to the micro-batch's longest, responses
//! to the batch's width), and the update nodes' losses are normalised over the whole mini-batch
//! (`GlobalBatchInfo`), so the log-probs and gradients are those of fixed micro-batches up to the
//! order of float sums. What does depend on the grouping is what verl's does too: the
//! `geo_mean` loss (a mean per micro-batch), clip_cov's random draws (seeded per micro-batch)
//! and the per-micro-batch means among the metrics.
//!
//! `padding_free` (verl `use_remove_padding`) changes how a micro-batch is laid out, not which
//! rows it holds: its sequences packed without padding ([`crate::train::sequences::Layout`]).

use anyhow::{Result, bail};
use flowrl_engine::{Diagnostic, ParamSpec, StepContext, ValidateCtx};
use serde::Deserialize;

use crate::train::sequences::Layout;
use crate::values::RolloutBatch;

/// The micro-batch parameters of a kind's parameter struct, as a flattened field whose specs
/// are [`param_specs`]: `#[serde(flatten)] #[param(specs = micro_batches::param_specs(None,
/// "..."))] micro: MicroBatchParams`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct MicroBatchParams {
    /// Rows per micro-batch (always set when [`param_specs`] gave it a default).
    pub micro_batch_size: Option<usize>,
    /// A token budget per micro-batch instead.
    pub max_tokens_per_micro_batch: Option<usize>,
    /// Lay a micro-batch's sequences out without padding.
    #[serde(default)]
    pub padding_free: bool,
}

impl MicroBatchParams {
    /// How a micro-batch's rows are laid out for the forward pass.
    pub fn layout(&self) -> Layout {
        Layout::padding_free(self.padding_free)
    }

    /// The micro-batching: the token budget when set, else `micro_batch_size` rows, or
    /// `default_rows` when that is not set either.
    pub fn micro_batching(&self, default_rows: usize) -> Result<MicroBatching> {
        MicroBatching::new(
            self.micro_batch_size.unwrap_or(default_rows),
            self.max_tokens_per_micro_batch,
        )
    }
}

/// The specs of [`MicroBatchParams`], for a kind's parameter list: `micro_batch_size` (with
/// `default_rows` as its default when given, documented by `rows_doc`),
/// `max_tokens_per_micro_batch` and `padding_free`.
pub fn param_specs(default_rows: Option<usize>, rows_doc: &str) -> Vec<ParamSpec> {
    let rows = ParamSpec::int("micro_batch_size").min(1.0);
    let rows = match default_rows {
        Some(d) => rows.default(d as i64),
        None => rows,
    };
    vec![
        rows.doc(rows_doc),
        ParamSpec::int("max_tokens_per_micro_batch").min(1.0).doc(
            "token budget per micro-batch instead of a row count (verl use_dynamic_bsz + \
             *_max_token_len_per_gpu): rows packed by prompt + response length into the fewest \
             micro-batches of at most this many tokens, balanced; a longer row gets its own \
             (with a warning). Exclusive with micro_batch_size",
        ),
        ParamSpec::bool("padding_free").default(false).doc(
            "pack each micro-batch's sequences without padding (verl use_remove_padding): \
             rows of the longest sequence's length, attention kept inside each sequence, its \
             own (multimodal) positions; the same log-probs as padded rows within float \
             rounding, less compute and memory when lengths differ",
        ),
    ]
}

/// The validation error of a node that sets both `micro_batch_size` and
/// `max_tokens_per_micro_batch`.
pub fn diagnostics(ctx: &ValidateCtx) -> Vec<Diagnostic> {
    if ctx.is_set("micro_batch_size") && ctx.is_set("max_tokens_per_micro_batch") {
        vec![ctx.error(
            "max_tokens_per_micro_batch",
            "set either micro_batch_size (rows per micro-batch) or max_tokens_per_micro_batch \
             (a token budget per micro-batch), not both",
        )]
    } else {
        Vec::new()
    }
}

/// How rows are split into micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatching {
    /// At most this many rows each, in order.
    Rows(usize),
    /// At most this many prompt + response tokens each, balanced (see the module doc).
    Tokens(usize),
}

impl MicroBatching {
    /// From a node's parameters: the token budget when `max_tokens` is set, else `rows`.
    pub fn new(rows: usize, max_tokens: Option<usize>) -> Result<Self> {
        match max_tokens {
            Some(0) => bail!("max_tokens_per_micro_batch must be >= 1"),
            Some(t) => Ok(Self::Tokens(t)),
            None if rows == 0 => bail!("micro_batch_size must be >= 1"),
            None => Ok(Self::Rows(rows)),
        }
    }

    /// The micro-batches of `rows` of `rollouts`: row indices, ascending within a micro-batch,
    /// micro-batches ordered by their first row (for rows given in ascending order).
    pub fn split(self, rollouts: &RolloutBatch, rows: &[usize]) -> Vec<Vec<usize>> {
        match self {
            Self::Rows(n) => rows.chunks(n.max(1)).map(<[usize]>::to_vec).collect(),
            Self::Tokens(budget) => {
                let lengths: Vec<usize> = rows.iter().map(|&r| row_tokens(rollouts, r)).collect();
                token_budget_partitions(&lengths, budget)
                    .into_iter()
                    .map(|p| p.into_iter().map(|i| rows[i]).collect())
                    .collect()
            }
        }
    }

    /// With a token budget, warns on `ctx` about the rows of `rollouts` longer than it (each
    /// runs as a micro-batch of its own), if there are any.
    pub fn warn_oversized(self, rollouts: &RolloutBatch, ctx: &mut StepContext) {
        if let Some(w) = self.oversized_warning(rollouts) {
            ctx.warn(w);
        }
    }

    /// The warning of [`Self::warn_oversized`].
    fn oversized_warning(self, rollouts: &RolloutBatch) -> Option<String> {
        let Self::Tokens(budget) = self else {
            return None;
        };
        let long: Vec<usize> = (0..rollouts.len())
            .map(|r| row_tokens(rollouts, r))
            .filter(|&len| len > budget)
            .collect();
        let longest = long.iter().copied().max()?;
        Some(format!(
            "{} row(s) longer than max_tokens_per_micro_batch = {budget} (the longest: {longest} \
             prompt + response tokens) each ran as a micro-batch of its own: raise the budget to \
             at least the longest prompt + response",
            long.len()
        ))
    }
}

/// Real tokens of row `r`: its prompt and its response, without padding.
pub fn row_tokens(rollouts: &RolloutBatch, r: usize) -> usize {
    rollouts.prompt_ids[r].len() + rollouts.response_ids[r].len()
}

/// Micro-batches (indices into `lengths`) of at most `budget` tokens each, but for items longer
/// than the budget, which are alone: the fewest balanced partitions ([`balanced_partitions`]),
/// from `⌈Σ / budget⌉` up, that fit (see the module doc).
pub fn token_budget_partitions(lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let n = lengths.len();
    if n == 0 {
        return Vec::new();
    }
    let budget = budget.max(1);
    let total: usize = lengths.iter().sum();
    let mut k = total.div_ceil(budget).clamp(1, n);
    loop {
        let parts = balanced_partitions(lengths, k);
        let fits = parts
            .iter()
            .all(|p| p.len() == 1 || p.iter().map(|&i| lengths[i]).sum::<usize>() <= budget);
        if fits || k == n {
            return parts;
        }
        k += 1;
    }
}

/// `items` (their lengths) split into `k` (1 ≤ k ≤ len) non-empty sets of balanced sums by the
/// Karmarkar–Karp largest differencing method, as verl's `karmarkar_karp` (`equal_size =
/// False`): every item starts as a k-way partition of its own; the two partitions of the largest
/// spread (largest − smallest set sum) are merged, largest set with smallest, until one is left.
/// Each set is returned ascending, the sets ordered by their first item. Ties are broken by the
/// sets' contents, so the result does not depend on the heap.
pub fn balanced_partitions(lengths: &[usize], k: usize) -> Vec<Vec<usize>> {
    use std::collections::BinaryHeap;
    let n = lengths.len();
    let k = k.clamp(1, n.max(1));
    if n == 0 {
        return Vec::new();
    }
    if k == 1 {
        return vec![(0..n).collect()];
    }
    if k == n {
        return (0..n).map(|i| vec![i]).collect();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (lengths[i], i));
    let mut heap: BinaryHeap<Partition> = order
        .into_iter()
        .map(|i| Partition::single(i, lengths[i] as u64, k))
        .collect();
    while heap.len() > 1 {
        let mut a = heap.pop().expect("two partitions");
        let b = heap.pop().expect("two partitions");
        a.merge(b);
        heap.push(a);
    }
    let mut parts: Vec<Vec<usize>> = heap
        .pop()
        .expect("one partition")
        .sets
        .into_iter()
        .map(|s| {
            let mut items = s.items;
            items.sort_unstable();
            items
        })
        .filter(|s| !s.is_empty())
        .collect();
    parts.sort_by_key(|s| s[0]);
    parts
}

/// One set of a [`Partition`]: its length sum and items (in the order they were added).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Set {
    sum: u64,
    items: Vec<usize>,
}

impl Ord for Set {
    /// verl's `Set.__lt__`: by sum, then item count, then items.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.sum, self.items.len(), &self.items).cmp(&(o.sum, o.items.len(), &o.items))
    }
}

impl PartialOrd for Set {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A k-way partition of some items, its sets in decreasing order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Partition {
    sets: Vec<Set>,
}

impl Partition {
    fn single(item: usize, len: u64, k: usize) -> Self {
        let mut sets = vec![
            Set {
                sum: 0,
                items: Vec::new()
            };
            k
        ];
        sets[0] = Set {
            sum: len,
            items: vec![item],
        };
        Self { sets }
    }

    fn spread(&self) -> u64 {
        self.sets[0].sum - self.sets[self.sets.len() - 1].sum
    }

    /// The largest set of `self` with the smallest of `o`, and so on; sets re-sorted.
    fn merge(&mut self, o: Partition) {
        for (mine, theirs) in self.sets.iter_mut().zip(o.sets.into_iter().rev()) {
            mine.sum += theirs.sum;
            mine.items.extend(theirs.items);
        }
        self.sets.sort_by(|a, b| b.cmp(a));
    }
}

impl Ord for Partition {
    /// The heap pops the greatest: the largest spread, then the largest first set (verl's
    /// `State.__lt__`).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.spread(), &self.sets[0]).cmp(&(o.spread(), &o.sets[0]))
    }
}

impl PartialOrd for Partition {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(parts: &[Vec<usize>], lengths: &[usize]) -> Vec<usize> {
        parts
            .iter()
            .map(|p| p.iter().map(|&i| lengths[i]).sum())
            .collect()
    }

    fn assert_is_partition(parts: &[Vec<usize>], n: usize) {
        let mut all: Vec<usize> = parts.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{parts:?}");
        assert!(parts.iter().all(|p| !p.is_empty()), "{parts:?}");
    }

    #[test]
    fn karmarkar_karp_balances_the_sums() {
        // The textbook example of the largest differencing method: {8,7,6,5,4} in two sets of 15.
        let lengths = [8, 7, 6, 5, 4];
        let parts = balanced_partitions(&lengths, 2);
        assert_is_partition(&parts, 5);
        let mut s = sums(&parts, &lengths);
        s.sort_unstable();
        // LDM's answer (16, 14), not the optimum (15, 15): the method verl uses.
        assert_eq!(s, vec![14, 16]);
        let lengths: Vec<usize> = (0..40).map(|i| 100 + (i * 37) % 91).collect();
        for k in 1..=8 {
            let parts = balanced_partitions(&lengths, k);
            assert_is_partition(&parts, lengths.len());
            assert_eq!(parts.len(), k);
            let s = sums(&parts, &lengths);
            let (lo, hi) = (s.iter().min().unwrap(), s.iter().max().unwrap());
            assert!(hi - lo <= 190, "k {k}: sums {s:?}");
        }
    }

    #[test]
    fn the_split_is_deterministic_and_ordered() {
        let lengths: Vec<usize> = (0..24).map(|i| 50 + (i * 13) % 29).collect();
        let a = token_budget_partitions(&lengths, 300);
        let b = token_budget_partitions(&lengths, 300);
        assert_eq!(a, b);
        for p in &a {
            assert!(p.windows(2).all(|w| w[0] < w[1]), "{p:?}");
        }
        assert!(a.windows(2).all(|w| w[0][0] < w[1][0]), "{a:?}");
    }

    #[test]
    fn every_micro_batch_fits_the_budget_but_a_longer_row_alone() {
        let lengths: Vec<usize> = (0..33).map(|i| 40 + (i * 29) % 97).collect();
        for budget in [136, 150, 200, 333, 1000, 10_000] {
            let parts = token_budget_partitions(&lengths, budget);
            assert_is_partition(&parts, lengths.len());
            for (p, s) in parts.iter().zip(sums(&parts, &lengths)) {
                assert!(s <= budget, "budget {budget}: {p:?} holds {s}");
            }
            // Never more micro-batches than rows, and at least the lower bound.
            let total: usize = lengths.iter().sum();
            assert!(parts.len() >= total.div_ceil(budget));
        }
        // A budget below the longest row: that row alone, reported; the others still fit.
        let lengths = [30, 500, 40, 50, 20];
        let parts = token_budget_partitions(&lengths, 100);
        assert_is_partition(&parts, 5);
        assert!(parts.contains(&vec![1]), "{parts:?}");
        for (p, s) in parts.iter().zip(sums(&parts, &lengths)) {
            assert!(p.len() == 1 || s <= 100, "{p:?} holds {s}");
        }
    }

    #[test]
    fn a_budget_takes_the_place_of_the_row_count() {
        assert_eq!(
            MicroBatching::new(16, Some(512)).unwrap(),
            MicroBatching::Tokens(512)
        );
        assert_eq!(
            MicroBatching::new(16, None).unwrap(),
            MicroBatching::Rows(16)
        );
        assert!(MicroBatching::new(0, None).is_err());
        assert!(MicroBatching::new(16, Some(0)).is_err());
    }
}
