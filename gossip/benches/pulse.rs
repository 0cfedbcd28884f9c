//! What pulses cost a node's CPU: one round (follow chitchat's node list, count, pick
//! a peer, encode the push), one push received (decode, take in, build and encode the
//! reply) and one reply received, for cliques of 18, 144 and 576 nodes that have
//! settled (every table the same). With one round and, on average, one push and one
//! reply received per interval, the sum times the pulse rate is a node's pulse CPU
//! while idle. Prints a table; asserts nothing.
//!
//! `cargo bench -p domaind-gossip --bench pulse`

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chitchat::ChitchatId;
use domaind_gossip::GossipTiming;
use domaind_gossip::pulse::table::{Mark, PulseTable};
use domaind_gossip::pulse::wire::Pulse;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn id(i: usize) -> ChitchatId {
    ChitchatId::new(
        format!("gb200-rack{:02}-node{:03}", i / 18, i),
        1_764_000_000_000 + i as u64,
        SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 7946)),
    )
}

fn known(n: usize, round: u64) -> Vec<(ChitchatId, Mark)> {
    (0..n)
        .map(|i| {
            (
                id(i),
                Mark {
                    heartbeat: round,
                    max_version: 7,
                },
            )
        })
        .collect()
}

/// Time per call of `work`, over enough calls to last about 200 ms.
fn per_call(mut work: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < Duration::from_millis(200) {
        work();
        calls += 1;
    }
    start.elapsed() / calls
}

fn main() {
    let timing = GossipTiming::default().pulse;
    let rounds_per_s = 1.0 / timing.interval.as_secs_f64();
    println!(
        "pulse CPU per node (one round, one push and one reply received per {:?})",
        timing.interval
    );
    println!(
        "{:>5} | {:>9} | {:>9} | {:>12} | {:>12} | {:>11} | {:>13}",
        "nodes", "round", "push in", "reply in", "push bytes", "reply bytes", "CPU (% core)"
    );
    for n in [18, 144, 576] {
        let now = tokio::time::Instant::now();
        // Settle: every node counts and exchanges with a random peer for a few rounds,
        // until every table has heard every count.
        let list = known(n, 1);
        let mut tables: Vec<PulseTable> = (0..n)
            .map(|i| {
                let mut table = PulseTable::new(id(i));
                table.sync(list.iter().cloned(), now);
                table
            })
            .collect();
        let mut rng = SmallRng::seed_from_u64(n as u64);
        for _ in 0..20 {
            for i in 0..n {
                tables[i].beat();
                let peer = (i + 1 + rng.random_range(0..n - 1)) % n;
                let push = tables[i].push();
                if let Some(reply) = tables[peer].receive(&push, now).reply {
                    tables[i].receive(&reply, now);
                }
            }
        }
        let mut a = tables.swap_remove(0);
        let mut b = tables.swap_remove(1);
        b.beat();
        let round_cost = per_call(|| {
            a.sync(list.iter().cloned(), now);
            a.beat();
            black_box(a.targets(now, timing.dead_after, &mut rng));
            black_box(a.push().encode());
        });
        let push = a.push().encode();
        let push_in = per_call(|| {
            let pulse = Pulse::decode(&push).unwrap();
            let received = b.receive(&pulse, now);
            black_box(received.reply.map(|r| r.encode()));
        });
        let reply = b
            .receive(&Pulse::decode(&push).unwrap(), now)
            .reply
            .unwrap()
            .encode();
        let reply_in = per_call(|| {
            let pulse = Pulse::decode(&reply).unwrap();
            black_box(a.receive(&pulse, now));
        });
        let cpu = (round_cost + push_in + reply_in).as_secs_f64() * rounds_per_s * 100.0;
        println!(
            "{:>5} | {:>9.1?} | {:>9.1?} | {:>12.1?} | {:>12} | {:>11} | {:>12.4}%",
            n,
            round_cost,
            push_in,
            reply_in,
            push.len(),
            reply.len(),
            cpu
        );
    }
}
