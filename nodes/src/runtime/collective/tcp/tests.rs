//! The group's tests: each runs every rank of a run as a thread of this process, on loopback.

use super::*;
use std::net::TcpListener;
use std::sync::Barrier;
use std::sync::atomic::AtomicUsize;

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TcpGroup>();
};

fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

fn config(address: &str, rank: usize, world: usize) -> JoinConfig {
    JoinConfig {
        address: address.to_string(),
        rank,
        world,
        fingerprint: vec![
            ("graph".into(), "abc".into()),
            ("resumed from step".into(), "40".into()),
        ],
        join_timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(20),
        liveness: Duration::from_secs(5),
    }
}

/// Runs `body` on `world` rank threads joined at `config(rank)`; returns their results.
fn run<T: Send>(
    world: usize,
    config: impl Fn(usize) -> JoinConfig + Sync,
    body: impl Fn(usize, TcpGroup) -> T + Sync,
) -> Vec<T> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (config, body) = (&config, &body);
                s.spawn(move || {
                    body(
                        rank,
                        TcpGroup::join(config(rank))
                            .unwrap_or_else(|e| panic!("rank {rank} join: {e}")),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn joins(configs: Vec<JoinConfig>) -> Vec<Result<TcpGroup, GroupError>> {
    thread::scope(|s| {
        let handles: Vec<_> = configs
            .into_iter()
            .map(|c| s.spawn(move || TcpGroup::join(c)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn inputs(rank: usize) -> Vec<f32> {
    match rank {
        0 => vec![1e8, 1.0, 0.1, -3.5, 7.0],
        1 => vec![1.0, 1e8, 0.2, 1e-3, 1.5],
        _ => vec![-1e8, -1e8, 0.3, 2.25, -0.75],
    }
}

#[test]
fn collectives_are_correct_and_identical_on_every_rank() {
    let address = free_address();
    let outputs = run(
        3,
        |r| config(&address, r, 3),
        |rank, g| {
            let mut out = Vec::new();
            let mut data = inputs(rank);
            g.all_reduce_sum("grads", &mut data).unwrap();
            let expected: Vec<f32> = (0..5)
                .map(|i| inputs(0)[i] + inputs(1)[i] + inputs(2)[i])
                .collect();
            assert_eq!(expected[0], 0.0, "rank order matters for this value");
            assert_eq!(bits(&data), bits(&expected));
            out.push(bits(&data));

            let counts = [2, 0, 3];
            let mine: Vec<f32> = (0..counts[rank])
                .map(|i| (rank * 10 + i) as f32 + 0.5)
                .collect();
            let all = g.all_gather("params", &mine, &counts).unwrap();
            assert_eq!(all, vec![0.5, 1.5, 20.5, 21.5, 22.5]);
            let at_root = g.gather_to_root("state", &mine, &counts).unwrap();
            assert_eq!(at_root, (rank == 0).then_some(all));

            let counts = [1, 3, 0];
            let full: Vec<f32> = (0..4).map(|i| inputs(rank)[i] * (i + 1) as f32).collect();
            let segment = g.reduce_scatter_sum("shards", &full, &counts).unwrap();
            let term = |r: usize, i: usize| inputs(r)[i] * (i + 1) as f32;
            let summed: Vec<f32> = (0..4)
                .map(|i| term(0, i) + term(1, i) + term(2, i))
                .collect();
            let start: usize = counts[..rank].iter().sum();
            assert_eq!(bits(&segment), bits(&summed[start..start + counts[rank]]));

            for root in [1, 2, 0] {
                let mut data = if rank == root {
                    vec![root as f32, 2.0, 3.0]
                } else {
                    vec![9.0; rank]
                };
                g.broadcast("weights", &mut data, root).unwrap();
                assert_eq!(data, vec![root as f32, 2.0, 3.0]);
            }
            g.barrier("end of setup").unwrap();

            for i in 0..2000 {
                let mut data = [rank as f32, i as f32, 1.0];
                g.all_reduce_sum("loop", &mut data).unwrap();
                assert_eq!(data, [3.0, 3.0 * i as f32, 3.0]);
            }

            let n = 16 << 20; // 64 MiB of f32
            let mut big: Vec<f32> = (0..n)
                .map(|i| (i % 1000) as f32 * (rank + 1) as f32)
                .collect();
            g.all_reduce_sum("big", &mut big).unwrap();
            assert!(
                big.iter()
                    .enumerate()
                    .all(|(i, v)| *v == (i % 1000) as f32 * 6.0)
            );
            assert!(g.failure().is_none());
            g.close();
            out
        },
    );
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn a_group_of_one_is_the_identity() {
    let g = TcpGroup::join(config("127.0.0.1:1", 0, 1)).unwrap();
    let mut data = vec![1.0, 2.0];
    g.all_reduce_sum("x", &mut data).unwrap();
    assert_eq!(data, vec![1.0, 2.0]);
    assert_eq!(g.all_gather("x", &[3.0], &[1]).unwrap(), vec![3.0]);
    assert_eq!(
        g.gather_to_root("x", &[3.0], &[1]).unwrap(),
        Some(vec![3.0])
    );
    assert_eq!(g.reduce_scatter_sum("x", &[4.0], &[1]).unwrap(), vec![4.0]);
    g.broadcast("x", &mut data, 0).unwrap();
    g.barrier("x").unwrap();
    g.close();
}

fn all_refused(results: Vec<Result<TcpGroup, GroupError>>, needles: &[&str]) {
    for result in results {
        let error = result.err().expect("the rendezvous must fail");
        for needle in needles {
            assert!(
                error.message.contains(needle),
                "`{needle}` missing from: {error}"
            );
        }
    }
}

#[test]
fn rendezvous_refuses_a_different_world() {
    let address = free_address();
    let mut other = config(&address, 1, 3);
    other.join_timeout = Duration::from_secs(5);
    all_refused(
        joins(vec![config(&address, 0, 2), other]),
        &["rank 1 says the run has 3 ranks, rank 0 says 2"],
    );
}

#[test]
fn rendezvous_refuses_a_duplicated_rank() {
    let address = free_address();
    all_refused(
        joins(vec![
            config(&address, 0, 3),
            config(&address, 1, 3),
            config(&address, 1, 3),
        ]),
        &["rank 1 joined twice"],
    );
}

#[test]
fn rendezvous_refuses_a_different_fingerprint() {
    let address = free_address();
    let mut other = config(&address, 1, 2);
    other.fingerprint[1].1 = "0".into();
    all_refused(
        joins(vec![config(&address, 0, 2), other]),
        &[
            "`resumed from step`",
            "rank 1 has `0`",
            "rank 0 has `40`",
            &address,
        ],
    );
}

#[test]
fn rank_zero_names_a_busy_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let error = TcpGroup::join(config(&address, 0, 2)).err().unwrap();
    assert!(error.message.contains(&address), "{error}");
}

#[test]
fn a_missing_rank_zero_is_named_after_the_join_timeout() {
    let address = free_address();
    let mut c = config(&address, 1, 2);
    c.join_timeout = Duration::from_secs(1);
    let start = Instant::now();
    let error = TcpGroup::join(c).err().unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(900) && start.elapsed() < Duration::from_secs(5)
    );
    assert!(
        error.message.contains(&address) && error.message.contains("cannot reach rank 0"),
        "{error}"
    );
}

#[test]
fn a_missing_rank_is_named_by_rank_zero() {
    let address = free_address();
    let mut c = config(&address, 0, 3);
    c.join_timeout = Duration::from_secs(1);
    let results = joins(vec![c, config(&address, 1, 3)]);
    all_refused(results, &["rank 2 of 3 did not join within 1 s", &address]);
}

/// Runs `body` on 3 ranks that meet at a barrier first and, after `body`, wait for each
/// other before dropping their groups.
fn scenario<T: Send>(
    config: impl Fn(usize) -> JoinConfig + Sync,
    body: impl Fn(usize, &TcpGroup) -> T + Sync,
) -> Vec<T> {
    let end = Barrier::new(3);
    run(3, config, |rank, g| {
        g.barrier("start").unwrap();
        let result = body(rank, &g);
        end.wait();
        result
    })
}

fn timed_reduce(g: &TcpGroup, label: &str) -> (Option<GroupError>, Duration) {
    let start = Instant::now();
    let mut data = vec![1.0; 8];
    (g.all_reduce_sum(label, &mut data).err(), start.elapsed())
}

#[test]
fn a_dead_rank_is_named_quickly() {
    let address = free_address();
    let results = run(
        3,
        |r| config(&address, r, 3),
        |rank, g| {
            g.barrier("start").unwrap();
            if rank == 2 {
                thread::sleep(Duration::from_millis(200));
                drop(g);
                return None;
            }
            Some(timed_reduce(&g, "step"))
        },
    );
    for (error, took) in results.into_iter().flatten() {
        let error = error.expect("the all-reduce must fail");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(error.message.contains("rank 2's process exited"), "{error}");
        assert_eq!(error.rank, Some(2));
    }
}

#[test]
fn a_stalled_rank_is_named_and_the_handler_fires_outside_operations() {
    let address = free_address();
    let results = scenario(
        |r| JoinConfig {
            liveness: Duration::from_secs(1),
            ..config(&address, r, 3)
        },
        |rank, g| {
            let (sender, receiver) = mpsc::channel();
            g.on_failure(Box::new(move |e| {
                let _ = sender.send(e.clone());
            }));
            let start = Instant::now();
            let in_op = match rank {
                0 => timed_reduce(g, "step").0,
                2 => {
                    g.pause_heartbeats();
                    None
                }
                _ => None,
            };
            let handled = receiver.recv_timeout(Duration::from_secs(10)).ok();
            (in_op, handled, start.elapsed())
        },
    );
    for (rank, (in_op, handled, took)) in results.into_iter().enumerate() {
        let handled = handled.unwrap_or_else(|| panic!("rank {rank}: handler not called"));
        assert!(
            handled.message.contains("rank 2 stopped answering"),
            "{handled}"
        );
        assert!(took < Duration::from_secs(5), "rank {rank}: {took:?}");
        if rank == 0 {
            assert!(
                in_op
                    .expect("the all-reduce must fail")
                    .message
                    .contains("rank 2 stopped answering")
            );
        }
    }
}

#[test]
fn a_stalled_rank_zero_is_named_by_the_others() {
    let address = free_address();
    let results = scenario(
        |r| JoinConfig {
            liveness: Duration::from_secs(1),
            ..config(&address, r, 3)
        },
        |rank, g| {
            if rank == 0 {
                g.pause_heartbeats();
                thread::sleep(Duration::from_secs(2));
                return None;
            }
            Some(timed_reduce(g, "step"))
        },
    );
    for (error, took) in results.into_iter().flatten() {
        let error = error.expect("the all-reduce must fail");
        assert!(
            error.message.contains("rank 0 stopped answering"),
            "{error}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}

#[test]
fn a_label_mismatch_is_named_on_every_rank() {
    let address = free_address();
    let results = scenario(
        |r| config(&address, r, 3),
        |rank, g| timed_reduce(g, if rank == 1 { "b" } else { "a" }).0,
    );
    for error in results {
        let error = error.expect("the all-reduce must fail");
        assert!(
            error
                .message
                .contains("collective mismatch: rank 1 called all_reduce_sum `b`"),
            "{error}"
        );
        assert!(
            error.message.contains("rank 0 called all_reduce_sum `a`"),
            "{error}"
        );
    }
}

#[test]
fn an_abort_reaches_every_rank() {
    let address = free_address();
    let results = scenario(
        |r| config(&address, r, 3),
        |rank, g| {
            if rank == 2 {
                g.abort("out of memory");
                return g.barrier("after").err();
            }
            timed_reduce(g, "step").0
        },
    );
    for error in results {
        let error = error.expect("every rank must fail");
        assert!(
            error.message.contains("rank 2 failed: out of memory"),
            "{error}"
        );
        assert_eq!(error.rank, Some(2));
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_after_the_op_timeout() {
    let address = free_address();
    let results = scenario(
        |r| JoinConfig {
            op_timeout: Duration::from_secs(1),
            liveness: Duration::from_secs(3),
            ..config(&address, r, 3)
        },
        |rank, g| {
            if rank == 2 {
                let start = Instant::now();
                while g.failure().is_none() && start.elapsed() < Duration::from_secs(10) {
                    thread::sleep(Duration::from_millis(10));
                }
                return (g.failure(), Duration::from_secs(1));
            }
            timed_reduce(g, "step")
        },
    );
    for (error, took) in results {
        let error = error.expect("every rank must fail");
        assert!(
            error
                .message
                .contains("rank 2 did not reach all_reduce_sum `step` within 1 s"),
            "{error}"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}

#[test]
fn close_is_not_a_failure() {
    let address = free_address();
    let calls = Arc::new(AtomicUsize::new(0));
    run(
        3,
        |r| config(&address, r, 3),
        |rank, g| {
            let calls = calls.clone();
            g.on_failure(Box::new(move |_| {
                calls.fetch_add(1, Ordering::SeqCst);
            }));
            g.barrier("last").unwrap();
            if rank == 1 {
                thread::sleep(Duration::from_millis(100));
            }
            assert!(g.failure().is_none());
            g.close();
        },
    );
    thread::sleep(Duration::from_millis(500));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
