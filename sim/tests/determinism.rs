//! The same seed gives the same run, bit for bit: two runs of one seed write the same
//! trace (compared by its digest), in one process and across the seeds of a range.

use sim::{Backend, Config};

fn digest(seed: u64, backend: Option<Backend>) -> (u64, u64) {
    let mut cfg = Config::new(seed);
    cfg.backend = backend;
    let outcome = sim::run(cfg);
    assert!(outcome.violation.is_none(), "{}", outcome.report());
    (outcome.digest, outcome.lines)
}

#[test]
fn a_seed_replays_bit_for_bit() {
    for seed in [1, 7, 42, 1_000_003] {
        let first = digest(seed, None);
        assert!(first.1 > 100, "seed {seed} wrote a real trace");
        assert_eq!(
            first,
            digest(seed, None),
            "seed {seed} ran differently twice"
        );
    }
}

#[test]
fn a_seed_on_sqlite_replays_bit_for_bit() {
    let first = digest(5, Some(Backend::Sqlite));
    assert_eq!(first, digest(5, Some(Backend::Sqlite)));
}

#[test]
fn different_seeds_make_different_runs() {
    let a = digest(11, None);
    let b = digest(12, None);
    assert_ne!(a.0, b.0);
}

/// Seeds the range check runs: 40 by default, `SIM_DETERMINISM_SEEDS` for more.
fn range() -> u64 {
    std::env::var("SIM_DETERMINISM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

#[test]
fn every_seed_of_a_range_replays_bit_for_bit() {
    for seed in 10_000..10_000 + range() {
        let a = sim::run(Config::new(seed));
        let b = sim::run(Config::new(seed));
        assert_eq!(
            (a.digest, a.lines),
            (b.digest, b.lines),
            "seed {seed} ran differently twice"
        );
    }
}
