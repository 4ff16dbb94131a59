//! Custody against an unkind world on a SQLite file (OB-03 to OB-15): the adversarial
//! property of [`fixtures::unkind`] (late, lost, duplicated and old-attempt answers, a
//! store that fails any call or commits and still reports failure, restarts) with the
//! durable backend underneath. Fewer cases than on the in-memory store: each one opens a
//! file.
#![allow(clippy::unwrap_used)]

use fixtures::unkind::{cmd, World};
use proptest::prelude::*;
use storage_sqlite::{Settings, SqliteStore};

proptest! {
    #![proptest_config(ProptestConfig {
        cases: (fixtures::proptest_cases() / 4).max(16),
        ..ProptestConfig::default()
    })]

    // OB-03, OB-07, OB-08, OB-09, OB-10, OB-12, OB-13, OB-15
    #[test]
    fn custody_on_sqlite_survives_an_unkind_world(cmds in proptest::collection::vec(cmd(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("custody.sqlite3"), Settings::default()).unwrap();
        let mut w = World::new(store, || SqliteStore::open_in_memory(Settings::default()).unwrap());
        for c in cmds {
            w.run(c)?;
        }
        w.quiesce()?;
    }
}
