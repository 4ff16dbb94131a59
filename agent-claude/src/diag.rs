//! Diagnostics a host can log: what the decoder and the transcript reader parsed,
//! skipped on purpose, did not know, or could not read.
//!
//! Invariant: every line handed in is counted exactly once, in exactly one of
//! `parsed`, `skipped`, `unknown` or `malformed` (blank lines count as `blank`), so
//! `lines == blank + malformed + sum(parsed) + sum(skipped) + sum(unknown)`. The
//! tallies are bounded: at most [`MAX_LABELS`] distinct labels per table, each at most
//! [`MAX_LABEL_CHARS`] characters; further labels are counted under [`OTHER_LABEL`], so
//! a stream of invented type names cannot grow memory without bound.

use std::collections::{BTreeMap, BTreeSet};

/// The most distinct labels one table keeps.
pub const MAX_LABELS: usize = 64;
/// The most characters of a label kept.
pub const MAX_LABEL_CHARS: usize = 64;
/// The label under which labels past [`MAX_LABELS`] are counted.
pub const OTHER_LABEL: &str = "(other)";

/// Counts by label (`assistant`, `system/init`, `stream_event/content_block_delta`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally(BTreeMap<String, u64>);

impl Tally {
    /// Adds one to `label` (cut to [`MAX_LABEL_CHARS`]; past [`MAX_LABELS`] distinct
    /// labels, to [`OTHER_LABEL`]).
    pub fn add(&mut self, label: &str) {
        // A label seen before, short enough to be kept whole: no allocation.
        if label.len() <= MAX_LABEL_CHARS {
            if let Some(n) = self.0.get_mut(label) {
                *n = n.saturating_add(1);
                return;
            }
        }
        let label: String = label.chars().take(MAX_LABEL_CHARS).collect();
        let key = if self.0.contains_key(&label) || self.0.len() < MAX_LABELS {
            label
        } else {
            OTHER_LABEL.to_owned()
        };
        let n = self.0.entry(key).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// The count of one label.
    pub fn get(&self, label: &str) -> u64 {
        self.0.get(label).copied().unwrap_or(0)
    }

    /// Every label with its count, in label order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The sum of all counts.
    pub fn total(&self) -> u64 {
        self.0.values().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a decoder or reader saw, for the host's log. Never fatal: an unknown line type,
/// an unknown event, delta or content-block type, an unknown field or a line that is not
/// JSON is counted here and skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// Lines handed in (complete lines; a torn last line is not counted until it is
    /// complete).
    pub lines: u64,
    /// Empty or whitespace-only lines.
    pub blank: u64,
    /// Lines that are not a JSON object, or whose known fields have the wrong shape.
    pub malformed: u64,
    /// The first error text of a malformed line, for the log.
    pub first_malformed: Option<String>,
    /// Lines read into a typed value, by label.
    pub parsed: Tally,
    /// Known lines skipped on purpose (metadata, progress, rate limits), by label.
    pub skipped: Tally,
    /// Lines of a type this crate does not know, by label; skipped.
    pub unknown: Tally,
    /// Unknown parts inside known lines (a stream event, delta or content-block type),
    /// by label; the part is skipped, the line is still used.
    pub unknown_parts: Tally,
    /// Top-level fields of known lines that this crate does not know, by name; counted
    /// only when field auditing is on.
    pub unknown_fields: Tally,
    /// The agent versions the input states (`claude_code_version`, `version`).
    pub versions: BTreeSet<String>,
}

impl Diagnostics {
    /// Records a malformed line.
    pub(crate) fn malformed(&mut self, error: &str) {
        self.malformed = self.malformed.saturating_add(1);
        if self.first_malformed.is_none() {
            self.first_malformed = Some(error.chars().take(200).collect());
        }
    }

    /// Records a stated agent version (at most [`MAX_LABELS`] distinct ones).
    pub(crate) fn version(&mut self, v: &str) {
        if self.versions.len() < MAX_LABELS && !v.trim().is_empty() {
            self.versions
                .insert(v.chars().take(MAX_LABEL_CHARS).collect());
        }
    }

    /// True when every counted line was parsed or deliberately skipped: nothing unknown,
    /// nothing malformed.
    pub fn all_understood(&self) -> bool {
        self.malformed == 0 && self.unknown.is_empty()
    }

    /// `blank + malformed + parsed + skipped + unknown`; equals [`Diagnostics::lines`].
    pub fn accounted(&self) -> u64 {
        self.blank
            .saturating_add(self.malformed)
            .saturating_add(self.parsed.total())
            .saturating_add(self.skipped.total())
            .saturating_add(self.unknown.total())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        let mut t = Tally::default();
        for i in 0..200 {
            t.add(&format!("kind-{i}"));
        }
        t.add(&"x".repeat(500));
        assert_eq!(t.iter().count(), MAX_LABELS + 1);
        assert_eq!(t.get(OTHER_LABEL), 200 - MAX_LABELS as u64 + 1);
        assert_eq!(t.total(), 201);
    }
}
