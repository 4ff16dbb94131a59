//! Test doubles shared by the host's integration tests.
#![allow(dead_code)]

use fixtures::failing::FailingOverlay;
use overlay_core::MemoryOverlayStore;

/// An overlay store that refuses writes of overlays (and, with `reads_off`, their loads)
/// while its plan says so: `fixtures::failing::FailingOverlay` failing only the
/// overlay's load and writes.
pub type Flaky = FailingOverlay<MemoryOverlayStore>;

/// A [`Flaky`] store with nothing failing yet.
pub fn flaky() -> Flaky {
    flaky_over(MemoryOverlayStore::new())
}

/// A [`Flaky`] store over `inner`.
pub fn flaky_over(inner: MemoryOverlayStore) -> Flaky {
    let store = FailingOverlay::new(inner);
    store.with_plan(|p| p.only = vec!["load", "compare_and_set", "update"]);
    store
}

/// Takes the store out of `host`, leaving a new empty one (a host that is dropped next).
pub fn take(overlays: &mut Flaky) -> Flaky {
    std::mem::replace(overlays, flaky())
}
