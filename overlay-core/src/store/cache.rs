//! The overlays a store's connection read or wrote last, kept in memory so a write
//! need not read the target's rows from the database again: [`OverlayCache`], shared by
//! the SQLite and the PostgreSQL stores.

use std::collections::HashMap;

use timeline_core::key::{SessionId, TargetId};

use super::rows::{OverlayRows, Snapshot};

/// Targets whose rows a connection keeps in memory. A target past this count pushes out
/// the one used longest ago; its next write reads its rows from the table again.
pub const OVERLAY_CACHE_TARGETS: usize = 64;

/// The overlays a connection read or wrote last, by target, each at the revision and
/// epoch it was read or written at.
///
/// A store uses an entry only inside a transaction that read the same revision and
/// epoch from the target's header row: the global counter never hands out a revision
/// twice (OV-02), so then no connection has written the target since. A store changes
/// an entry only after its write committed; a failed or refused write leaves the entry
/// of the version the database still holds.
#[derive(Default)]
pub struct OverlayCache {
    entries: HashMap<(SessionId, TargetId), (Snapshot, u64)>,
    clock: u64,
}

impl OverlayCache {
    /// An empty cache.
    pub fn new() -> OverlayCache {
        OverlayCache::default()
    }

    /// The rows of the target if the cached version is `revision` and `epoch`.
    pub fn rows(
        &mut self,
        session: &SessionId,
        target: &TargetId,
        revision: u64,
        epoch: u64,
    ) -> Option<OverlayRows> {
        self.clock += 1;
        let (snapshot, used) = self.entries.get_mut(&(session.clone(), target.clone()))?;
        if (snapshot.revision, snapshot.settlement_epoch) != (revision, epoch) {
            return None;
        }
        *used = self.clock;
        Some(snapshot.rows().clone())
    }

    /// Keeps `snapshot` as the target's version, pushing out the target used longest
    /// ago when [`OVERLAY_CACHE_TARGETS`] are kept already.
    pub fn put(&mut self, session: &SessionId, target: &TargetId, snapshot: Snapshot) {
        self.clock += 1;
        let k = (session.clone(), target.clone());
        if self.entries.len() >= OVERLAY_CACHE_TARGETS && !self.entries.contains_key(&k) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(k, (snapshot, self.clock));
    }

    /// Forgets the target (it was deleted, or a write's outcome is not known).
    pub fn forget(&mut self, session: &SessionId, target: &TargetId) {
        self.entries.remove(&(session.clone(), target.clone()));
    }

    /// How many targets are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no target is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl std::fmt::Debug for OverlayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverlayCache")
            .field("targets", &self.entries.len())
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(n: usize) -> (SessionId, TargetId) {
        let s = SessionId::new(format!("s{n}")).unwrap();
        let t = TargetId::main(&s);
        (s, t)
    }

    fn empty(revision: u64, epoch: u64) -> Snapshot {
        Snapshot::new(revision, epoch, OverlayRows::default())
    }

    // OV-02: an entry serves only the version it was kept at.
    #[test]
    fn an_entry_answers_only_for_its_revision_and_epoch() {
        let mut c = OverlayCache::new();
        let (s, t) = key(0);
        c.put(&s, &t, empty(7, 2));
        assert!(c.rows(&s, &t, 7, 2).is_some());
        assert!(c.rows(&s, &t, 8, 2).is_none(), "another revision");
        assert!(c.rows(&s, &t, 7, 3).is_none(), "another epoch");
        c.forget(&s, &t);
        assert!(c.rows(&s, &t, 7, 2).is_none());
    }

    // At the limit, the target used longest ago goes; the others stay.
    #[test]
    fn past_the_limit_the_target_used_longest_ago_goes() {
        let mut c = OverlayCache::new();
        for n in 0..OVERLAY_CACHE_TARGETS {
            let (s, t) = key(n);
            c.put(&s, &t, empty(1, 0));
        }
        assert_eq!(c.len(), OVERLAY_CACHE_TARGETS);
        // Target 0 is used again; target 1 is now the one used longest ago.
        let (s0, t0) = key(0);
        assert!(c.rows(&s0, &t0, 1, 0).is_some());
        let (s, t) = key(OVERLAY_CACHE_TARGETS);
        c.put(&s, &t, empty(1, 0));
        assert_eq!(c.len(), OVERLAY_CACHE_TARGETS, "one past the limit");
        let (s1, t1) = key(1);
        assert!(c.rows(&s1, &t1, 1, 0).is_none(), "the oldest went");
        assert!(c.rows(&s0, &t0, 1, 0).is_some());
        assert!(c.rows(&s, &t, 1, 0).is_some());
        // Writing a kept target again pushes nothing out.
        c.put(&s0, &t0, empty(2, 0));
        assert_eq!(c.len(), OVERLAY_CACHE_TARGETS);
    }
}
