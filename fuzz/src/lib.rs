//! Fuzz targets for every decoder and reducer of the workspace that takes outside input.
//!
//! Each target is a module with one entry point, `run(data)`, that reads its input as a
//! [`script::Script`], drives the library with it and asserts the laws the module doc
//! names; a panic is a finding. The binaries under `fuzz_targets/` only hand libFuzzer's
//! input to `run`, so the same code also replays a corpus or a reproducer without
//! libFuzzer (`tests/corpus.rs`). The corpus generator (`examples/make_corpus.rs`) writes
//! seeds through the writer functions beside each target, so seeds and readers share one
//! format.

pub mod script;

/// The targets, one module each.
pub mod targets {
    pub mod agent_lines;
    pub mod client_replay;
    pub mod envelope;
    pub mod history;
    pub mod overlay_replay;
    pub mod rows;
    pub mod timeline;
    pub mod tokens;
    pub mod wire;

    /// The entry point of a target: runs one input, panics on a finding.
    pub type Run = fn(&[u8]);

    /// Every target by name, with its entry point.
    pub const ALL: [(&str, Run); 9] = [
        ("tokens", tokens::run),
        ("timeline", timeline::run),
        ("history", history::run),
        ("overlay_replay", overlay_replay::run),
        ("client_replay", client_replay::run),
        ("envelope", envelope::run),
        ("rows", rows::run),
        ("agent_lines", agent_lines::run),
        ("wire", wire::run),
    ];
}
