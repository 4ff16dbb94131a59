//! Session titles (OB-18).
//!
//! The first message names the session: a provisional title from the first 4 words of
//! the first non-empty line, or "Fresh chat"; it replaces only a placeholder. Then the
//! session's agent writes the final title: 2 to 4 words, at most 36 characters. Codex
//! tries up to 3 times, Claude once ([`title_attempts`]). One generation runs per
//! session at a time; a failure keeps the provisional title. A session that a session
//! message starts is named from the message body, not the envelope.
//!
//! A line ends at every line break, not only `\n`: `\r\n`, a bare `\r`, NEL (U+0085) and
//! the Unicode line and paragraph separators (U+2028, U+2029) end the first line too
//! ([`timeline_core::rows::is_line_break`]), so a provisional title never takes words
//! from a second line. A final title is one line: its line breaks count as spaces.

use std::collections::BTreeMap;

use timeline_core::rows::first_line;

use crate::adapter::AgentKind;
use crate::entry::OutboxEntry;
use crate::ids::SessionId;

/// The title when the first line gives nothing.
pub const FRESH_CHAT: &str = "Fresh chat";
/// Titles that a provisional title may replace.
pub const PLACEHOLDER_TITLES: [&str; 3] = ["", "New session", "Untitled session"];
/// Words a provisional title takes from the first non-empty line.
pub const PROVISIONAL_TITLE_WORDS: usize = 4;
/// The fewest words in a final title.
pub const FINAL_TITLE_MIN_WORDS: usize = 2;
/// The most words in a final title.
pub const FINAL_TITLE_MAX_WORDS: usize = 4;
/// The most characters in a final title.
pub const FINAL_TITLE_MAX_CHARS: usize = 36;
/// Attempts a Codex title generation makes before the provisional title stays.
pub const CODEX_TITLE_ATTEMPTS: u32 = 3;
/// Attempts a Claude title generation makes (the seed names no retry for Claude).
pub const CLAUDE_TITLE_ATTEMPTS: u32 = 1;

/// The provisional title of a first message: the first 4 words of its first non-empty
/// line, or [`FRESH_CHAT`].
pub fn provisional_title(first_message: &str) -> String {
    let words: Vec<&str> = first_line(first_message)
        .split_whitespace()
        .take(PROVISIONAL_TITLE_WORDS)
        .collect();
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

/// Checks a generated final title (trimmed, whitespace and line breaks collapsed to one
/// space, 2 to 4 words, at most 36 characters).
pub fn final_title(generated: &str) -> Result<String, TitleError> {
    let words: Vec<&str> = generated.split_whitespace().collect();
    if !(FINAL_TITLE_MIN_WORDS..=FINAL_TITLE_MAX_WORDS).contains(&words.len()) {
        return Err(TitleError::WordCount);
    }
    let t = words.join(" ");
    if t.chars().count() > FINAL_TITLE_MAX_CHARS {
        return Err(TitleError::TooLong);
    }
    Ok(t)
}

/// How many attempts a title generation by `agent` makes.
pub fn title_attempts(agent: AgentKind) -> u32 {
    match agent {
        AgentKind::Codex => CODEX_TITLE_ATTEMPTS,
        // The seed names no count for other agents: one try, as Claude's.
        AgentKind::Claude | AgentKind::Acp => CLAUDE_TITLE_ATTEMPTS,
    }
}

/// What happens after one attempt of a title generation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TitleStep {
    /// The attempt failed or wrote an invalid title and attempts remain: ask the agent
    /// again. The generation stays running.
    Retry {
        /// The number of the next attempt (2 or 3 for Codex).
        attempt: u32,
    },
    /// The generation ended: the new title, or the current (provisional) one when every
    /// attempt failed.
    Done(String),
}

/// One title generation per session at a time.
#[derive(Clone, Debug, Default)]
pub struct TitleGenerations {
    /// Running generations and the attempts each has made.
    running: BTreeMap<SessionId, u32>,
}

impl TitleGenerations {
    /// No generation runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a generation; false when one already runs for the session.
    pub fn begin(&mut self, session: &SessionId) -> bool {
        if self.running.contains_key(session) {
            return false;
        }
        self.running.insert(session.clone(), 0);
        true
    }

    /// True while a generation runs for the session.
    pub fn is_running(&self, session: &SessionId) -> bool {
        self.running.contains_key(session)
    }

    /// Ends a generation after one attempt: the new title, or the current (provisional)
    /// one when the generation failed or wrote an invalid title.
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

    /// Records one attempt of the running generation, which makes at most
    /// `max_attempts` ([`title_attempts`]): a valid title ends it; a failure or an
    /// invalid title asks for another attempt while attempts remain, and otherwise ends
    /// it with `current` kept. An attempt for a session with no running generation ends
    /// at once with `current`.
    pub fn attempt(
        &mut self,
        session: &SessionId,
        current: &str,
        generated: Result<String, String>,
        max_attempts: u32,
    ) -> TitleStep {
        let Some(made) = self.running.get_mut(session) else {
            return TitleStep::Done(current.to_owned());
        };
        *made = made.saturating_add(1);
        let made = *made;
        if let Ok(Ok(title)) = generated.as_deref().map(final_title) {
            self.running.remove(session);
            return TitleStep::Done(title);
        }
        if made < max_attempts {
            return TitleStep::Retry { attempt: made + 1 };
        }
        self.running.remove(session);
        TitleStep::Done(current.to_owned())
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
