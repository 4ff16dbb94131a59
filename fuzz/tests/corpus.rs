//! Replays every seed of `fuzz/corpus/<target>/` through its target without libFuzzer,
//! so a plain `cargo test` proves that the seeds still drive each target without a
//! finding, and that every target has seeds; and every saved reproducer of
//! `fuzz/regressions/<target>/`, so a fixed finding stays fixed.

use std::fs;
use std::path::PathBuf;

#[test]
fn every_seed_passes_its_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (name, run) in custody_fuzz::targets::ALL {
        let dir = root.join(name);
        let mut seeds: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "target {name} has no seeds");
        for seed in seeds {
            let data = fs::read(&seed).unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "seed {} fails target {name}",
                seed.display()
            );
        }
    }
}

#[test]
fn every_saved_reproducer_passes_its_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for (name, run) in custody_fuzz::targets::ALL {
        let Ok(entries) = fs::read_dir(root.join(name)) else {
            continue;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            let data = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "reproducer {} fails target {name}",
                path.display()
            );
        }
    }
}
