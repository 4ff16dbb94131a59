//! Session titles (OB-18).
//!
//! The first message names the session: a provisional title from the first 4 words of
//! the first non-empty line, or "Fresh chat"; it replaces only a placeholder. Then the
//! session's agent writes the final title: 2 to 4 words, at most 36 characters. One
//! generation runs per session at a time; a failure keeps the provisional title. A
//! session that a session message starts is named from the message body, not the
//! envelope.

use std::collections::BTreeSet;

use crate::entry::OutboxEntry;
use crate::ids::SessionId;

/// The title when the first line gives nothing.
pub const FRESH_CHAT: &str = "Fresh chat";
/// Titles that a provisional title may replace.
pub const PLACEHOLDER_TITLES: [&str; 3] = ["", "New session", "Untitled session"];
/// The most characters in a final title.
pub const FINAL_TITLE_MAX_CHARS: usize = 36;

/// The provisional title of a first message.
pub fn provisional_title(first_message: &str) -> String {
    let line = first_message.lines().find(|l| !l.trim().is_empty());
    let words: Vec<&str> = line
        .map(|l| l.split_whitespace().take(4).collect())
        .unwrap_or_default();
    if words.is_empty() {
        FRESH_CHAT.to_owned()
    } else {
        words.join(" ")
    }
}

/// True when `title` is a placeholder a provisional title may replace.
pub fn is_placeholder(title: &str) -> bool {
    PLACEHOLDER_TITLES.contains(&title.trim())
}

/// The text a session's title is made from: the body of a session message, the text
/// of any other message.
pub fn title_source(first: &OutboxEntry) -> &str {
    &first.request.user_text
}

/// Why a generated title was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TitleError {
    /// Fewer than 2 or more than 4 words.
    #[error("a title has 2 to 4 words")]
    WordCount,
    /// More than 36 characters.
    #[error("a title has at most 36 characters")]
    TooLong,
}

/// Checks a generated final title (trimmed, 2 to 4 words, at most 36 characters).
pub fn final_title(generated: &str) -> Result<String, TitleError> {
    let t = generated.split_whitespace().collect::<Vec<_>>().join(" ");
    let words = t.split(' ').filter(|w| !w.is_empty()).count();
    if !(2..=4).contains(&words) {
        return Err(TitleError::WordCount);
    }
    if t.chars().count() > FINAL_TITLE_MAX_CHARS {
        return Err(TitleError::TooLong);
    }
    Ok(t)
}

/// One title generation per session at a time.
#[derive(Clone, Debug, Default)]
pub struct TitleGenerations {
    running: BTreeSet<SessionId>,
}

impl TitleGenerations {
    /// No generation runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a generation; false when one already runs for the session.
    pub fn begin(&mut self, session: &SessionId) -> bool {
        self.running.insert(session.clone())
    }

    /// Ends a generation: the new title, or the current (provisional) one when the
    /// generation failed or wrote an invalid title.
    pub fn finish(
        &mut self,
        session: &SessionId,
        current: &str,
        generated: Result<String, String>,
    ) -> String {
        self.running.remove(session);
        match generated.ok().map(|g| final_title(&g)) {
            Some(Ok(t)) => t,
            _ => current.to_owned(),
        }
    }
}

/// The title a session gets from its first message: the provisional title replaces a
/// placeholder only.
pub fn title_after_first_message(current: &str, first: &OutboxEntry) -> String {
    if is_placeholder(current) {
        provisional_title(title_source(first))
    } else {
        current.to_owned()
    }
}
