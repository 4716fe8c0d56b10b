//! The collectives of a [`TcpGroup`]: every rank sends its values to rank 0, which checks the
//! signatures, computes the answer in rank order and sends each rank its part.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Instant;

use super::TcpGroup;
use super::basics::{GroupError, POLL, group_error, lock, secs};
use super::wire::Kind;

/// What rank 0 answers in a collective: rank r receives `values[parts[r]]`.
struct Answer {
    values: Vec<f32>,
    parts: Vec<Range<usize>>,
}

impl Answer {
    fn to_all(values: Vec<f32>, world: usize) -> Answer {
        let parts = vec![0..values.len(); world];
        Answer { values, parts }
    }
}

/// `first + rows[0] + rows[1] + …` element by element, in this order.
fn sum_in_rank_order(first: &[f32], rows: &[Vec<f32>]) -> Vec<f32> {
    let mut sum = first.to_vec();
    for row in rows {
        sum.iter_mut()
            .zip(row)
            .for_each(|(sum, value)| *sum += *value);
    }
    sum
}

impl TcpGroup {
    /// Element-wise sum over ranks, summed at rank 0 in rank order (0, 1, …, W−1, sequential f32
    /// adds), result written back into `data` on every rank (identical bits everywhere).
    pub fn all_reduce_sum(&self, label: &str, data: &mut [f32]) -> Result<(), GroupError> {
        let what = format!("all_reduce_sum `{label}`");
        let sig = format!("{what} over {} values", data.len());
        let world = self.world();
        let sum = self.exchange(&what, &sig, data, |rows| {
            Answer::to_all(sum_in_rank_order(data, &rows[1..]), world)
        })?;
        data.copy_from_slice(&sum);
        Ok(())
    }

    /// Every rank passes its own segment `mine` (`mine.len() == counts[rank]`); returns the
    /// concatenation of all ranks' segments in rank order (`counts.iter().sum()` values).
    pub fn all_gather(
        &self,
        label: &str,
        mine: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, GroupError> {
        self.gather("all_gather", label, mine, counts, true)
    }

    /// [`TcpGroup::all_gather`] whose answer only rank 0 receives (`Some`; the others `None`
    /// once rank 0 has it): how one rank collects what is written once, without sending it back.
    pub fn gather_to_root(
        &self,
        label: &str,
        mine: &[f32],
        counts: &[usize],
    ) -> Result<Option<Vec<f32>>, GroupError> {
        let all = self.gather("gather_to_root", label, mine, counts, false)?;
        Ok((self.rank() == 0).then_some(all))
    }

    /// The concatenation of every rank's `mine`, answered to every rank (`to_all`) or to rank
    /// 0 only (the others get nothing).
    fn gather(
        &self,
        op: &str,
        label: &str,
        mine: &[f32],
        counts: &[usize],
        to_all: bool,
    ) -> Result<Vec<f32>, GroupError> {
        let what = format!("{op} `{label}`");
        self.check_counts(&what, counts)?;
        if mine.len() != counts[self.rank()] {
            let problem = format!(
                "this rank passes {} values but counts[{}] is {}",
                mine.len(),
                self.rank(),
                counts[self.rank()]
            );
            return Err(self.invalid(&what, problem));
        }
        let world = self.world();
        self.exchange(
            &what,
            &format!("{what} with counts {counts:?}"),
            mine,
            |rows| {
                let mut all = mine.to_vec();
                rows[1..].iter().for_each(|row| all.extend_from_slice(row));
                let mut parts = vec![0..all.len(); world];
                if !to_all {
                    parts[1..].fill(0..0);
                }
                Answer { values: all, parts }
            },
        )
    }

    /// Every rank passes a full buffer (`counts.iter().sum()` values); returns rank r's segment
    /// (`counts[r]` values, starting at `counts[..r].iter().sum()`) of the element-wise sum (same
    /// summation order as [`TcpGroup::all_reduce_sum`]). Rank 0 sends each rank only its segment.
    pub fn reduce_scatter_sum(
        &self,
        label: &str,
        data: &[f32],
        counts: &[usize],
    ) -> Result<Vec<f32>, GroupError> {
        let what = format!("reduce_scatter_sum `{label}`");
        self.check_counts(&what, counts)?;
        let total: usize = counts.iter().sum();
        if data.len() != total {
            let problem = format!(
                "this rank passes {} values but the counts add up to {total}",
                data.len()
            );
            return Err(self.invalid(&what, problem));
        }
        self.exchange(
            &what,
            &format!("{what} with counts {counts:?}"),
            data,
            |rows| {
                let mut end = 0;
                let parts = counts
                    .iter()
                    .map(|&count| {
                        end += count;
                        end - count..end
                    })
                    .collect();
                Answer {
                    values: sum_in_rank_order(data, &rows[1..]),
                    parts,
                }
            },
        )
    }

    /// `data` of rank `root` replaces `data` on every rank (the length may differ before the
    /// call on the other ranks).
    pub fn broadcast(
        &self,
        label: &str,
        data: &mut Vec<f32>,
        root: usize,
    ) -> Result<(), GroupError> {
        let what = format!("broadcast `{label}`");
        if root >= self.world() {
            return Err(self.invalid(
                &what,
                format!(
                    "root {root} is not a rank of a run of {} ranks",
                    self.world()
                ),
            ));
        }
        let (world, is_root) = (self.world(), self.rank() == root);
        let mine: &[f32] = if is_root { data } else { &[] };
        let values = self.exchange(
            &what,
            &format!("{what} from rank {root}"),
            mine,
            |mut rows| {
                let values = if root == 0 {
                    data.clone()
                } else {
                    std::mem::take(&mut rows[root])
                };
                let mut parts = vec![0..values.len(); world];
                parts[root] = 0..0; // the root only learns that everyone arrived
                Answer { values, parts }
            },
        )?;
        if !is_root {
            *data = values;
        }
        Ok(())
    }

    /// Returns once every rank has called `barrier` with the same label.
    pub fn barrier(&self, label: &str) -> Result<(), GroupError> {
        let what = format!("barrier `{label}`");
        let world = self.world();
        self.exchange(&what, &what, &[], |_| Answer::to_all(Vec::new(), world))
            .map(drop)
    }

    fn check(&self) -> Result<(), GroupError> {
        self.failure().map_or(Ok(()), Err)
    }

    /// A mistake of this rank's caller: fails the group (telling the others), returns the failure.
    fn invalid(&self, what: &str, problem: String) -> GroupError {
        self.abort(&format!("{what}: {problem}"));
        self.failure().expect("abort records a failure")
    }

    fn check_counts(&self, what: &str, counts: &[usize]) -> Result<(), GroupError> {
        if counts.len() == self.world() {
            return Ok(());
        }
        Err(self.invalid(
            what,
            format!(
                "counts has {} entries for a run of {} ranks",
                counts.len(),
                self.world()
            ),
        ))
    }

    /// One collective: every rank sends `mine` (under the signature `sig`) to rank 0, which
    /// computes the answer from every rank's values (`rows[r]` for r ≥ 1, its own are `mine`),
    /// sends each rank its part and returns its own.
    fn exchange(
        &self,
        what: &str,
        sig: &str,
        mine: &[f32],
        compute: impl FnOnce(Vec<Vec<f32>>) -> Answer,
    ) -> Result<Vec<f32>, GroupError> {
        self.check()?;
        if self.rank() != 0 {
            // Rank 0 knows which rank is missing: it gets the time to report first.
            let deadline = Instant::now() + self.shared.op_timeout + self.shared.liveness;
            self.send_data(0, sig, what, mine)?;
            return self.receive(0, sig, what, deadline);
        }
        let deadline = Instant::now() + self.shared.op_timeout;
        let mut rows = vec![Vec::new()];
        for r in 1..self.world() {
            rows.push(self.receive(r, sig, what, deadline)?);
        }
        let Answer { values, parts } = compute(rows);
        for r in 1..self.world() {
            self.send_data(r, sig, what, &values[parts[r].clone()])?;
        }
        Ok(if parts[0] == (0..values.len()) {
            values
        } else {
            values[parts[0].clone()].to_vec()
        })
    }

    fn send_data(
        &self,
        to: usize,
        sig: &str,
        what: &str,
        values: &[f32],
    ) -> Result<(), GroupError> {
        self.shared.send(to, Kind::Data, sig, values).map_err(|e| {
            let message = format!(
                "rank {} cannot send {what} to rank {to}: the connection broke ({e})",
                self.rank()
            );
            self.shared.fail(group_error(message, Some(to)), None)
        })
    }

    /// Waits for the Data frame of rank `from` for the operation `sig` until `deadline`.
    fn receive(
        &self,
        from: usize,
        sig: &str,
        what: &str,
        deadline: Instant,
    ) -> Result<Vec<f32>, GroupError> {
        let inbox = lock(
            self.inboxes[from]
                .as_ref()
                .expect("no connection to this rank"),
        );
        let me = self.rank();
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                let error = if me == 0 {
                    group_error(
                        format!(
                            "rank {from} did not reach {what} within {}",
                            secs(self.shared.op_timeout)
                        ),
                        Some(from),
                    )
                } else {
                    let waited = secs(self.shared.op_timeout + self.shared.liveness);
                    group_error(
                        format!(
                            "{what} did not complete within {waited}: the run's other ranks did not all reach it (no answer from rank 0)"
                        ),
                        None,
                    )
                };
                return Err(self.shared.fail(error, None));
            }
            match inbox.recv_timeout(POLL.min(deadline - now)) {
                Ok((got, values)) if got == sig => return Ok(values),
                Ok((got, _)) => {
                    let (caller, answered) = if me == 0 {
                        (from, "called")
                    } else {
                        (0, "answered")
                    };
                    let message = format!(
                        "collective mismatch: rank {caller} {answered} {got} where rank {me} called {sig}"
                    );
                    return Err(self.shared.fail(group_error(message, Some(caller)), None));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.check()?;
                    let peer = self.shared.peers[from]
                        .as_ref()
                        .expect("no connection to this rank");
                    let message = if peer.gone.load(Ordering::SeqCst) {
                        format!(
                            "rank {from} left the group (it closed normally) but rank {me} called {what}"
                        )
                    } else {
                        format!("rank {from}'s process exited or its connection broke")
                    };
                    return Err(self.shared.fail(group_error(message, Some(from)), None));
                }
            }
        }
    }
}
