//! The collective operations between the replica threads of one process.
//!
//! Every operation is a round: each replica deposits its buffer under the round's number (its
//! own count of operations so far), waits until all replicas of the process have deposited, and
//! takes a reference to every deposit. The last replica to take them frees the round. A fast
//! replica may deposit into the next round while a slow one is still reading the last, so no
//! replica waits twice. What a replica computes from the deposits (a sum, a concatenation, one
//! replica's buffer) it computes in replica order, so every replica gets the same bits.
//!
//! Every wait polls the abort flag its [`crate::runtime::data_parallel::Replicas::run`] shares,
//! fails as soon as a replica it waits for is seen in a later round (it skipped this one), and
//! gives up after the timeout, naming the replicas that never arrived.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often a waiting replica looks at the abort flag.
const POLL: Duration = Duration::from_millis(50);

/// The meeting point of one process's replicas for the operations of one data-parallel call.
pub struct LocalGroup {
    size: usize,
    rounds: Mutex<HashMap<u64, Round>>,
    arrived: Condvar,
    timeout: Duration,
}

/// One operation: what each replica deposited, and how many have taken the deposits.
struct Round {
    deposits: Vec<Option<Deposit>>,
    arrived: usize,
    taken: usize,
}

/// One replica's buffer, under the label of the operation it called.
#[derive(Clone, Debug)]
pub struct Deposit {
    pub label: Arc<str>,
    pub data: Arc<Vec<f32>>,
}

/// The error a replica returns when a sibling failed first.
#[derive(Debug)]
pub struct Aborted;

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped because another replica failed")
    }
}

impl std::error::Error for Aborted {}

impl LocalGroup {
    /// A group of `size` replicas whose waits give up after `timeout`.
    pub fn new(size: usize, timeout: Duration) -> Self {
        LocalGroup {
            size,
            rounds: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            timeout,
        }
    }

    /// Deposits `data` as replica `index`'s part of its `round`-th operation (labelled
    /// `label`), waits for every replica's part, and returns all of them in replica order. An
    /// error when a sibling failed (`abort`), when a replica called another operation in the
    /// same round, or when not all replicas arrived within the timeout.
    pub fn exchange(
        &self,
        index: usize,
        round: u64,
        label: &str,
        data: Vec<f32>,
        abort: &AtomicBool,
    ) -> Result<Vec<Deposit>> {
        let start = Instant::now();
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let r = rounds.entry(round).or_insert_with(|| Round {
            deposits: vec![None; self.size],
            arrived: 0,
            taken: 0,
        });
        r.deposits[index] = Some(Deposit {
            label: label.into(),
            data: Arc::new(data),
        });
        r.arrived += 1;
        if r.arrived == self.size {
            self.arrived.notify_all();
        }
        loop {
            let r = &rounds[&round];
            if r.arrived == self.size {
                break;
            }
            if abort.load(Ordering::SeqCst) {
                return Err(Aborted.into());
            }
            // A replica missing here that already called a later operation skipped this one.
            let skipped = (0..self.size).find(|&i| {
                r.deposits[i].is_none()
                    && rounds
                        .iter()
                        .any(|(&k, o)| k > round && o.deposits[i].is_some())
            });
            if let Some(i) = skipped {
                bail!(
                    "collective operations out of order: local replica {i} called a later                      operation while local replica {index} waits in `{label}` (the replicas                      must make the same collective calls)"
                );
            }
            if start.elapsed() >= self.timeout {
                let missing: Vec<String> = (0..self.size)
                    .filter(|&i| r.deposits[i].is_none())
                    .map(|i| i.to_string())
                    .collect();
                bail!(
                    "collective `{label}` timed out after {} s: local replica(s) {} of this \
                     process did not reach it",
                    self.timeout.as_secs(),
                    missing.join(", ")
                );
            }
            rounds = self
                .arrived
                .wait_timeout(rounds, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let r = rounds.get_mut(&round).expect("the round is complete");
        let all: Vec<Deposit> = r.deposits.iter().flatten().cloned().collect();
        r.taken += 1;
        if r.taken == self.size {
            rounds.remove(&round);
        }
        drop(rounds);
        if let Some((i, other)) = all.iter().enumerate().find(|(_, d)| *d.label != *label) {
            bail!(
                "collective operations out of order: local replica {index} called `{label}` \
                 where local replica {i} called `{}`",
                other.label
            );
        }
        Ok(all)
    }
}

/// The element-wise sum of `parts` (all of one length), added in order.
pub fn sum_in_order(parts: &[Deposit]) -> Result<Vec<f32>> {
    let mut out = parts[0].data.as_ref().clone();
    for (i, p) in parts.iter().enumerate().skip(1) {
        if p.data.len() != out.len() {
            bail!(
                "all-reduce of buffers of different lengths: local replica {i} passed {} values, \
                 replica 0 passed {}",
                p.data.len(),
                out.len()
            );
        }
        for (o, v) in out.iter_mut().zip(p.data.iter()) {
            *o += v;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_threads<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn rounds_pair_by_number_and_free_themselves() {
        let group = LocalGroup::new(3, Duration::from_secs(10));
        let abort = AtomicBool::new(false);
        let sums = on_threads(3, |i| {
            (0..500u64)
                .map(|round| {
                    let all = group
                        .exchange(i, round, "sum", vec![i as f32, round as f32], &abort)
                        .unwrap();
                    sum_in_order(&all).unwrap()
                })
                .collect::<Vec<_>>()
        });
        for per_replica in &sums {
            for (round, s) in per_replica.iter().enumerate() {
                assert_eq!(s, &vec![3.0, 3.0 * round as f32]);
            }
        }
        assert!(group.rounds.lock().unwrap().is_empty());
    }

    #[test]
    fn a_label_mismatch_is_an_error_and_a_missing_replica_times_out() {
        let group = LocalGroup::new(2, Duration::from_millis(300));
        let abort = AtomicBool::new(false);
        let out = on_threads(2, |i| {
            let label = if i == 0 { "a" } else { "b" };
            group.exchange(i, 0, label, vec![], &abort).map(|_| ())
        });
        let msg = format!("{:#}", out[0].as_ref().unwrap_err());
        assert!(msg.contains("out of order") && msg.contains("`b`"), "{msg}");
        let err = group.exchange(0, 1, "x", vec![], &abort).unwrap_err();
        assert!(format!("{err:#}").contains("local replica(s) 1"), "{err:#}");
    }
}
