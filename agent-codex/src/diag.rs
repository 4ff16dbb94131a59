//! What a reader or codec skipped, counted, so a host can log it: a newer agent version
//! degrades (its unknown methods, item types and lines are counted here) instead of
//! breaking anything.
//!
//! Invariant: every input the crate does not turn into a typed value is counted exactly
//! once, either as [`Skip::Ignored`] (known, deliberately not used) or as
//! [`Skip::Unknown`] / [`Skip::Malformed`] (what a host should look at).

use std::collections::BTreeMap;

/// Why something was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Known to this version and deliberately not used (rate limits, token usage, ...).
    Ignored,
    /// Not known to this version: a new method, item type or line type.
    Unknown,
    /// Known, but its shape is not what this version reads (or not JSON at all).
    Malformed,
}

/// Counters of skipped input, by reason and label (`notification:account/rateLimits/updated`,
/// `item:collabAgentToolCall`, `line:not-json`, ...), and the agent version where the
/// stream or file states it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// The agent version, from the `initialize` answer's user agent, a thread's
    /// `cliVersion` or a rollout's `session_meta.cli_version` (the latest one seen).
    pub agent_version: Option<String>,
    counts: BTreeMap<(Skip, String), u64>,
}

impl Diagnostics {
    /// No counts, no version.
    pub fn new() -> Diagnostics {
        Diagnostics::default()
    }

    /// Counts one skipped input.
    pub fn count(&mut self, why: Skip, label: impl Into<String>) {
        let n = self.counts.entry((why, label.into())).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// How many inputs were skipped for `why` with `label`.
    pub fn get(&self, why: Skip, label: &str) -> u64 {
        self.counts
            .get(&(why, label.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// How many inputs were skipped for `why`, all labels together.
    pub fn total(&self, why: Skip) -> u64 {
        self.counts
            .iter()
            .filter(|((w, _), _)| *w == why)
            .fold(0u64, |acc, (_, n)| acc.saturating_add(*n))
    }

    /// Every counter, in order of reason and label.
    pub fn iter(&self) -> impl Iterator<Item = (Skip, &str, u64)> + '_ {
        self.counts.iter().map(|((w, l), n)| (*w, l.as_str(), *n))
    }

    /// Adds every counter of `other` to this one's, and takes its version when it states
    /// one.
    pub fn absorb(&mut self, other: &Diagnostics) {
        for ((why, label), n) in &other.counts {
            let mine = self.counts.entry((*why, label.clone())).or_insert(0);
            *mine = mine.saturating_add(*n);
        }
        if let Some(v) = &other.agent_version {
            self.agent_version = Some(v.clone());
        }
    }

    /// Records the agent version when `version` is not blank.
    pub fn set_version(&mut self, version: &str) {
        let v = version.trim();
        if !v.is_empty() {
            self.agent_version = Some(v.to_owned());
        }
    }
}

impl std::fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "codex {}:",
            self.agent_version.as_deref().unwrap_or("(version unknown)")
        )?;
        for (why, label, n) in self.iter() {
            write!(f, " {why:?} {label} x{n};")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_reason_and_label() {
        let mut d = Diagnostics::new();
        d.count(Skip::Unknown, "notification:x/y");
        d.count(Skip::Unknown, "notification:x/y");
        d.count(Skip::Ignored, "notification:a/b");
        assert_eq!(d.get(Skip::Unknown, "notification:x/y"), 2);
        assert_eq!(d.total(Skip::Unknown), 2);
        assert_eq!(d.total(Skip::Ignored), 1);
        assert_eq!(d.total(Skip::Malformed), 0);
        d.set_version("  ");
        assert_eq!(d.agent_version, None);
        d.set_version("0.147.0");
        assert_eq!(d.agent_version.as_deref(), Some("0.147.0"));
    }
}
