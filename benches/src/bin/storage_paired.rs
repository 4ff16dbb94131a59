//! The storage ratios measured paired: the raw append (a), the raw append on the
//! library's page settings (a2), our submit (b) and the hand-written submit (e) take turns
//! in rounds of commits, in a rotating order, on their own files in one directory, so a
//! slow stretch of the disk falls on all of them alike. Each round gives one time per
//! commit per case; the report prints the median over rounds and the median, lowest and
//! highest of the per-round ratios. Each `synchronous` level runs twice, once with the
//! short keys and once with UUID keys (`benches::storage::Keys`), each run on new files:
//! the UUID keys' checkpoints write pages all over their files, and in the same run that
//! disk traffic would slow the other cases too.
//!
//! `cargo run --release -p benches --bin storage-paired`

use std::time::Instant;

use benches::storage::{HandSubmit, Keys, OurSubmit, RawAppend};
use storage_sqlite::Synchronous;

enum Case {
    Raw(RawAppend),
    Ours(OurSubmit),
    Hand(HandSubmit),
}

impl Case {
    fn commit(&mut self) {
        match self {
            Case::Raw(c) => c.commit(),
            Case::Ours(c) => c.commit(),
            Case::Hand(c) => c.commit(),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.2} (lowest {lo:.2}, highest {hi:.2})",
        median(v.to_vec())
    )
}

fn run(sync: Synchronous, keys: Keys, warm: usize, rounds: usize, per_round: usize) {
    let dir = tempfile::tempdir().expect("dir");
    let path = |name: &str| dir.path().join(format!("{name}.sqlite"));
    let mut cases = [
        (
            "(a) raw append",
            Case::Raw(RawAppend::open(&path("a"), sync, false)),
        ),
        (
            "(a2) raw append, library pages",
            Case::Raw(RawAppend::open(&path("a2"), sync, true)),
        ),
        (
            "(b) our submit",
            Case::Ours(OurSubmit::open(&path("b"), sync, keys)),
        ),
        (
            "(e) hand-written submit",
            Case::Hand(HandSubmit::open(&path("e"), sync, keys)),
        ),
    ];
    for (_, case) in cases.iter_mut() {
        for _ in 0..warm {
            case.commit();
        }
    }
    let mut micros = vec![Vec::with_capacity(rounds); cases.len()];
    for round in 0..rounds {
        for k in 0..cases.len() {
            let index = (round + k) % cases.len();
            let case = &mut cases[index].1;
            let start = Instant::now();
            for _ in 0..per_round {
                case.commit();
            }
            micros[index].push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
    }
    println!(
        "\nsynchronous = {sync:?}, {keys:?} keys: {rounds} rounds of {per_round} commits per case, after {warm} each"
    );
    println!("| case | median time per commit | rate |");
    println!("|---|---:|---:|");
    for ((name, _), times) in cases.iter().zip(&micros) {
        let m = median(times.clone());
        println!("| {name} | {m:.1} µs | {:.1}k/s |", 1e3 / m);
    }
    let ratio = |num: usize, den: usize| -> Vec<f64> {
        micros[num]
            .iter()
            .zip(&micros[den])
            .map(|(n, d)| n / d)
            .collect()
    };
    println!("(b)/(a) rate: {}", spread(&ratio(0, 2)));
    println!("(b)/(a2) rate: {}", spread(&ratio(1, 2)));
    println!("(b) time / (e) time: {}", spread(&ratio(2, 3)));
}

fn main() {
    // Warm-ups long enough that every WAL has been through one checkpoint: until then
    // the WAL file grows, and with FULL every sync then also commits its new size.
    for keys in [Keys::Short, Keys::Uuid] {
        run(Synchronous::Normal, keys, 20_000, 31, 2_000);
        run(Synchronous::Full, keys, 10_000, 21, 1_000);
    }
}
