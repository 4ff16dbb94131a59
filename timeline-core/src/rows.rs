//! Row wording (RW-01 to RW-06): the host writes every word of a row; clients lay it out.
//!
//! - [`ActivityRow`]: title, subtitle, `display.signal`, status, detail. Constructors
//!   build the common rows so the usual mistakes cannot be made (a command row has no
//!   subtitle, a message row no detail, a file read its `sourcePath`, a `languageHint`
//!   only on text that really is JSON, JSONL, a unified diff or a `FILE <path>` dump, a
//!   context line never the title again, the signal again or a status word, a signal
//!   never the title again); [`validate`] reports every broken rule of a row that came
//!   from the wire, and every row a constructor builds validates clean.
//! - [`MessageFact`]: the typed fact of a message between sessions or agents, with the
//!   words for the other end ([`OtherEnd`]), the row title and the delivery signal.
//! - [`status_row`]: the `thinking-<runId>` row and its phase label.
//! - [`ApprovalRequest`]: the shared approval model, the allowed-decision check, and the
//!   length-prefixed card ID with its parser; [`approval_card`]: the card, a live
//!   activity row of kind `event` whose `approval` field holds its [`CardStatus`].
//!
//! Where a row shows one line (a subtitle made from a summary, a failure reason, the
//! words for the other end inside a title), every line break counts, not only `\n`:
//! `\r\n`, a bare `\r`, NEL (U+0085) and the Unicode line and paragraph separators
//! (U+2028, U+2029) too ([`is_line_break`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::key::AgentKind;
pub use crate::text::{first_line, first_line_chars, is_line_break, one_line};

/// The status of an activity row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RowStatus {
    /// Still running.
    InProgress,
    /// The row's work completed.
    Completed,
    /// The row's work failed.
    Failed,
    /// Declined by the user.
    Declined,
}

/// Words that name a status; subtitles and signals never contain them.
pub const STATUS_WORDS: [&str; 6] = [
    "in progress",
    "in-progress",
    "completed",
    "failed",
    "declined",
    "running",
];

/// The format of a detail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DetailFormat {
    /// Markdown text.
    Markdown,
    /// Plain text (wrapped as it is, unless it has a language hint).
    Plaintext,
    /// A shell transcript.
    Shell,
}

/// What a plaintext detail provably is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LanguageHint {
    /// Complete JSON (an object or an array).
    Json,
    /// JSON Lines: every non-empty line a JSON object or array, at least two lines.
    Jsonl,
    /// A unified diff.
    Diff,
    /// A `FILE <path>` dump.
    File,
}

/// The text that opens on a tap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    /// The text.
    pub text: String,
    /// Its format.
    pub format: DetailFormat,
    /// Only on plaintext that is what the hint says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language_hint: Option<LanguageHint>,
    /// The file a read came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
}

impl Detail {
    /// Plain text, with the language hint the text proves (if any).
    pub fn plaintext(text: impl Into<String>) -> Detail {
        let text = text.into();
        Detail {
            language_hint: detect_language(&text),
            text,
            format: DetailFormat::Plaintext,
            source_path: None,
        }
    }

    /// A shell transcript.
    pub fn shell(text: impl Into<String>) -> Detail {
        Detail {
            text: text.into(),
            format: DetailFormat::Shell,
            language_hint: None,
            source_path: None,
        }
    }

    /// A markdown detail of `text`.
    pub fn markdown(text: impl Into<String>) -> Detail {
        Detail {
            text: text.into(),
            format: DetailFormat::Markdown,
            language_hint: None,
            source_path: None,
        }
    }
}

fn is_container_json(s: &str) -> bool {
    let t = s.trim();
    (t.starts_with('{') || t.starts_with('['))
        && serde_json::from_str::<serde_json::Value>(t).is_ok()
}

fn is_unified_diff(text: &str) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    let Some(minus) = lines.iter().position(|l| l.starts_with("--- ")) else {
        return false;
    };
    if !lines.get(minus + 1).is_some_and(|l| l.starts_with("+++ ")) {
        return false;
    }
    let mut hunks = 0;
    let mut i = minus + 2;
    while i < lines.len() {
        let l = lines[i];
        if let Some(header) = l.strip_prefix("@@ -") {
            let Some((ranges, _)) = header.split_once(" @@") else {
                return false;
            };
            let Some((old, new)) = ranges.split_once(" +") else {
                return false;
            };
            let nums = |r: &str| {
                r.split(',')
                    .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            };
            if !(nums(old) && nums(new)) {
                return false;
            }
            hunks += 1;
        } else if l.starts_with("--- ")
            || l.starts_with("+++ ")
            || l.starts_with("diff ")
            || l.starts_with("index ")
        {
            // File headers, also of the next file of a multi-file diff.
        } else if hunks == 0 || !(l.is_empty() || l.starts_with([' ', '+', '-', '\\'])) {
            // Body lines before any hunk, or lines no diff body has.
            return false;
        }
        i += 1;
    }
    hunks > 0
}

/// What the text provably is: complete JSON, JSONL, a unified diff or a `FILE <path>`
/// dump. Anything else gets no hint (RW-01).
pub fn detect_language(text: &str) -> Option<LanguageHint> {
    if let Some(first) = text.lines().next() {
        if first
            .strip_prefix("FILE ")
            .is_some_and(|p| !p.trim().is_empty())
        {
            return Some(LanguageHint::File);
        }
    }
    if is_container_json(text) {
        return Some(LanguageHint::Json);
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() >= 2 && lines.iter().all(|l| is_container_json(l)) {
        return Some(LanguageHint::Jsonl);
    }
    if is_unified_diff(text) {
        return Some(LanguageHint::Diff);
    }
    None
}

/// The kind of an activity row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum ActivityKind {
    /// A shell command.
    Command,
    /// A file read.
    FileRead,
    /// A file change.
    FileChange,
    /// A tool call.
    ToolCall,
    /// A search.
    Search,
    /// A plan update.
    Plan,
    /// The agent reasons.
    Reasoning,
    /// A message between sessions or agents.
    Message,
    /// An event of the run; an approval card is one (with its [`ActivityRow::approval`]
    /// field), not a kind of its own (RW-06).
    Event,
}

/// `display` of a row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Display {
    /// A fact: "Exit 1", "Draft 2", "Sent".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// An activity row as the host writes it (and a client receives it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ActivityRow {
    /// What it is.
    pub kind: ActivityKind,
    /// The headline.
    pub title: String,
    /// The context line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtitle: Option<String>,
    /// The signal.
    #[serde(default)]
    pub display: Display,
    /// The state.
    pub status: RowStatus,
    /// What opens on a tap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
    /// The message fact of a message row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<MessageFact>,
    /// The approval of an approval card: its request and card status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalCard>,
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(path)
}

fn parent_dir(path: &str) -> Option<String> {
    let trimmed = path.trim_end_matches('/');
    let (dir, _) = trimmed.rsplit_once('/')?;
    (!dir.is_empty()).then(|| dir.to_owned())
}

/// The most characters a context line made from a summary shows.
pub const SUMMARY_MAX_CHARS: usize = 120;

/// `line` as the context line of a row titled `title` beside `signal`, or nothing when
/// [`validate`] would refuse it there: blank, the title again, the signal again, or a
/// status word (RW-01). "It never repeats the title." / "it never repeats the title or
/// the context line." / "The context line and the signal never say a status word."
fn context_line(line: String, title: &str, signal: Option<&str>) -> Option<String> {
    let n = norm(&line);
    let keep = !n.is_empty()
        && n != norm(title)
        && signal.is_none_or(|s| norm(s) != n)
        && status_word_in(&line).is_none();
    keep.then_some(line)
}

/// The first line of a summary (at most [`SUMMARY_MAX_CHARS`]) as a context line, see
/// [`context_line`].
fn summary_line(summary: Option<&str>, title: &str, signal: Option<&str>) -> Option<String> {
    context_line(first_line_chars(summary?, SUMMARY_MAX_CHARS), title, signal)
}

/// `signal` beside `title`, or nothing when it would repeat the title or say a status
/// word (RW-01): a command `exit 1` that exits with 1 shows no "Exit 1" beside itself.
fn signal_beside(signal: Option<String>, title: &str) -> Option<String> {
    signal.filter(|s| norm(s) != norm(title) && status_word_in(s).is_none())
}

impl ActivityRow {
    /// A command run: the command is the title, no subtitle; the exit code is the signal
    /// once it ended; the output opens as a shell transcript.
    pub fn command(
        command: &str,
        status: RowStatus,
        exit_code: Option<i32>,
        output: &str,
    ) -> ActivityRow {
        let title = command.trim().to_owned();
        let signal = exit_code
            .filter(|_| status != RowStatus::InProgress)
            .map(|c| format!("Exit {c}"));
        ActivityRow {
            kind: ActivityKind::Command,
            subtitle: None,
            display: Display {
                signal: signal_beside(signal, &title),
            },
            title,
            status,
            detail: (!output.is_empty()).then(|| Detail::shell(output)),
            message: None,
            approval: None,
        }
    }

    /// A file read: "Read `<name>`", the folder as context, the contents with their
    /// `sourcePath`.
    pub fn file_read(path: &str, status: RowStatus, contents: &str) -> ActivityRow {
        let mut detail = Detail::plaintext(contents);
        detail.source_path = Some(path.to_owned());
        let title = format!("Read {}", file_name(path));
        ActivityRow {
            kind: ActivityKind::FileRead,
            subtitle: parent_dir(path).and_then(|d| context_line(d, &title, None)),
            title,
            display: Display::default(),
            status,
            detail: Some(detail),
            message: None,
            approval: None,
        }
    }

    /// A file change: "Edited `<name>`" (or "Created"), the folder as context, the diff.
    pub fn file_change(path: &str, created: bool, status: RowStatus, diff: &str) -> ActivityRow {
        let title = format!(
            "{} {}",
            if created { "Created" } else { "Edited" },
            file_name(path)
        );
        ActivityRow {
            kind: ActivityKind::FileChange,
            subtitle: parent_dir(path).and_then(|d| context_line(d, &title, None)),
            title,
            display: Display::default(),
            status,
            detail: (!diff.is_empty()).then(|| Detail::plaintext(diff)),
            message: None,
            approval: None,
        }
    }

    /// A tool call: "Used `<tool>`", the first line of an optional summary as context
    /// (left out where it would repeat the title or say a status word), the arguments
    /// (and result) as the detail.
    pub fn tool_call(
        tool: &str,
        summary: Option<&str>,
        status: RowStatus,
        detail: &str,
    ) -> ActivityRow {
        let title = format!("Used {tool}");
        ActivityRow {
            kind: ActivityKind::ToolCall,
            subtitle: summary_line(summary, &title, None),
            title,
            display: Display::default(),
            status,
            detail: (!detail.is_empty()).then(|| Detail::plaintext(detail)),
            message: None,
            approval: None,
        }
    }

    /// A message row: every word comes from the fact, "`Message to <to>`" on a sent row
    /// (also while a call to a named agent still runs); the first line of the summary as
    /// context, left out where it would repeat the title or the signal or say a status
    /// word; no detail on the wire (RW-01, RW-04).
    ///
    /// A `send_session_message` call that still runs ([`SendCall::SessionMessage`]) is
    /// not a message row yet: it stays the plain call row "Send message to session",
    /// without a message fact.
    pub fn message(fact: MessageFact, summary: Option<&str>) -> ActivityRow {
        if fact.running_call == Some(SendCall::SessionMessage) {
            let title = RUNNING_SEND_TITLE.to_owned();
            return ActivityRow {
                kind: ActivityKind::ToolCall,
                subtitle: summary_line(summary, &title, None),
                title,
                display: Display::default(),
                status: RowStatus::InProgress,
                detail: None,
                message: None,
                approval: None,
            };
        }
        let status = match fact.delivery {
            Some(MessageDelivery::NotSent) => RowStatus::Failed,
            _ if fact.running_call.is_some() => RowStatus::InProgress,
            _ => RowStatus::Completed,
        };
        let title = fact.title();
        let signal = fact.signal();
        ActivityRow {
            kind: ActivityKind::Message,
            subtitle: summary_line(summary, &title, signal),
            title,
            display: Display {
                signal: signal.map(str::to_owned),
            },
            status,
            detail: None,
            message: Some(fact),
            approval: None,
        }
    }
}

/// One broken wording rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RuleViolation {
    /// The title is blank.
    BlankTitle,
    /// The subtitle repeats the title.
    SubtitleRepeatsTitle,
    /// A status word in the subtitle.
    StatusWordInSubtitle(String),
    /// A status word in the signal.
    StatusWordInSignal(String),
    /// The signal repeats the title.
    SignalRepeatsTitle,
    /// The signal repeats the subtitle.
    SignalRepeatsSubtitle,
    /// A command row has a subtitle.
    CommandWithSubtitle,
    /// A message row has a detail.
    MessageWithDetail,
    /// A message row without its message fact.
    MessageWithoutFact,
    /// A language hint on text that is not what it says (or not plaintext).
    WrongLanguageHint {
        /// The hint given.
        given: LanguageHint,
        /// What the text is, if anything.
        actual: Option<LanguageHint>,
    },
    /// A file read without its `sourcePath`.
    FileReadWithoutSourcePath,
    /// A message-fact rule (see [`MessageFact::violations`]).
    Message(MessageRule),
    /// An approval card whose kind is not `event`.
    CardNotAnEvent,
    /// An approval card whose signal is not the label of its card status.
    CardSignalNotFromStatus,
}

impl fmt::Display for RuleViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

fn norm(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn status_word_in(s: &str) -> Option<String> {
    let n = norm(s);
    STATUS_WORDS
        .iter()
        .find(|w| {
            n.match_indices(*w).any(|(i, _)| {
                let before = n[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric());
                let after = n[i + w.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !c.is_alphanumeric());
                before && after
            })
        })
        .map(|w| (*w).to_owned())
}

/// Every broken rule of a row (RW-01, RW-02, RW-04, RW-06). An empty list means the row
/// is well worded. Every row the constructors of this module build validates clean.
pub fn validate(row: &ActivityRow) -> Vec<RuleViolation> {
    let mut out = Vec::new();
    if row.title.trim().is_empty() {
        out.push(RuleViolation::BlankTitle);
    }
    if let Some(sub) = &row.subtitle {
        if norm(sub) == norm(&row.title) {
            out.push(RuleViolation::SubtitleRepeatsTitle);
        }
        if let Some(w) = status_word_in(sub) {
            out.push(RuleViolation::StatusWordInSubtitle(w));
        }
        if row.kind == ActivityKind::Command {
            out.push(RuleViolation::CommandWithSubtitle);
        }
    }
    if let Some(signal) = &row.display.signal {
        if let Some(w) = status_word_in(signal) {
            out.push(RuleViolation::StatusWordInSignal(w));
        }
        if norm(signal) == norm(&row.title) {
            out.push(RuleViolation::SignalRepeatsTitle);
        }
        if row
            .subtitle
            .as_deref()
            .is_some_and(|s| norm(s) == norm(signal))
        {
            out.push(RuleViolation::SignalRepeatsSubtitle);
        }
    }
    if let Some(d) = &row.detail {
        if let Some(given) = d.language_hint {
            let actual = detect_language(&d.text);
            if d.format != DetailFormat::Plaintext || actual != Some(given) {
                out.push(RuleViolation::WrongLanguageHint { given, actual });
            }
        }
        if row.kind == ActivityKind::FileRead && d.source_path.is_none() {
            out.push(RuleViolation::FileReadWithoutSourcePath);
        }
    } else if row.kind == ActivityKind::FileRead {
        out.push(RuleViolation::FileReadWithoutSourcePath);
    }
    if row.kind == ActivityKind::Message {
        if row.detail.is_some() {
            out.push(RuleViolation::MessageWithDetail);
        }
        match &row.message {
            None => out.push(RuleViolation::MessageWithoutFact),
            Some(fact) => {
                out.extend(fact.violations().into_iter().map(RuleViolation::Message));
                if row.title != fact.title() {
                    out.push(RuleViolation::Message(MessageRule::TitleNotFromFact));
                }
                if row.display.signal.as_deref() != fact.signal() {
                    out.push(RuleViolation::Message(MessageRule::SignalNotFromDelivery));
                }
            }
        }
    }
    if let Some(card) = &row.approval {
        if row.kind != ActivityKind::Event {
            out.push(RuleViolation::CardNotAnEvent);
        }
        if row.display.signal.as_deref() != card.status.label() {
            out.push(RuleViolation::CardSignalNotFromStatus);
        }
    }
    out
}

// ----- message facts (RW-02 to RW-04) ---------------------------------------------------

/// Which way a message went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// This end sent it.
    Sent,
    /// This end received it.
    Received,
}

/// A message, or a task that gives an agent its work (received rows only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum MessageKind {
    /// A message.
    Message,
    /// A task.
    Task,
}

/// The kind of the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum PeerKind {
    /// A session.
    Session,
    /// An agent.
    Agent,
}

/// The other end's kind and agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Peer {
    /// Session or agent.
    pub kind: PeerKind,
    /// Absent only when the call named a session that does not exist
    /// ([`OtherEnd::NoSession`]); every session that exists carries its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentKind>,
}

/// Delivery of a sent session message whose call ended (`deliveryOnly`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum MessageDelivery {
    /// Delivered into the recipient's custody.
    Sent,
    /// Waiting for the user's approval.
    NeedsApproval,
    /// Not sent (declined, or the call failed).
    NotSent,
}

/// Where a message row links.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageLink {
    /// The other end's session; absent: this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_session_id: Option<String>,
    /// The other end's thread; absent: the main timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// An opaque `ta1.` anchor token.
    pub anchor: String,
}

/// The reason shown when the user removed a session message from the queue.
pub const DECLINED_REASON: &str = "The user removed the message from the queue.";
/// The most characters a failure reason shows.
pub const FAILURE_REASON_MAX_CHARS: usize = 220;
/// The plain row of a `send_session_message` call that still runs.
pub const RUNNING_SEND_TITLE: &str = "Send message to session";
/// The words for the other end when the call named no session of this host.
pub const UNKNOWN_SESSION: &str = "Unknown session";

/// The call that sends a message, while it still runs (host-side; not on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendCall {
    /// A `send_session_message` call: it stays the plain call row "Send message to
    /// session" until it ends.
    SessionMessage,
    /// A call that messages a named agent (a Claude `SendMessage` to a teammate, a task
    /// given to a subagent): already the row "`Message to <to>`", without a signal.
    AgentMessage,
}

/// The words for the other end of a message (RW-03).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OtherEnd {
    /// Another session of this host; its title and the agent it runs.
    Session {
        /// Its title.
        title: String,
        /// The agent of that session.
        agent: AgentKind,
    },
    /// The call named no session of this host (none, or one that does not exist): the
    /// only end whose peer has no agent.
    NoSession,
    /// The lead agent of a Claude session.
    ClaudeLead,
    /// A Claude subagent; its title in the agents list.
    ClaudeSubagent {
        /// Its title.
        title: Option<String>,
    },
    /// A Claude session outside this host; its name.
    OutsideClaude {
        /// Its name.
        name: Option<String>,
    },
    /// The Codex root thread.
    CodexRoot,
    /// A Codex agent thread; the words of its agent path.
    CodexAgent {
        /// The agent path, e.g. `["android_landing"]`.
        path: Vec<String>,
    },
}

fn nonblank(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// "android_landing" → "Android landing".
fn path_words(segment: &str) -> String {
    let words: Vec<String> = segment
        .split(['_', '-', ' '])
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut s = words.join(" ");
    if let Some(first) = s.get(..1) {
        s = first.to_uppercase() + &s[1..];
    }
    s
}

impl OtherEnd {
    /// The words (never blank, never an ID, always one line).
    pub fn words(&self) -> String {
        let words = match self {
            OtherEnd::Session { title, .. } => nonblank(Some(title))
                .unwrap_or("Untitled session")
                .to_owned(),
            OtherEnd::NoSession => UNKNOWN_SESSION.to_owned(),
            OtherEnd::ClaudeLead => "Claude".to_owned(),
            OtherEnd::ClaudeSubagent { title } => {
                nonblank(title.as_deref()).unwrap_or("Subagent").to_owned()
            }
            OtherEnd::OutsideClaude { name } => nonblank(name.as_deref())
                .unwrap_or("Another Claude session")
                .to_owned(),
            OtherEnd::CodexRoot => "Codex".to_owned(),
            OtherEnd::CodexAgent { path } => {
                match path
                    .last()
                    .map(|p| path_words(p))
                    .filter(|w| !w.trim().is_empty())
                {
                    Some(w) => w,
                    None => "Codex".to_owned(),
                }
            }
        };
        // A name with a line break in it still names one end: the row title that holds
        // it ("Message to <to>") stays one line.
        one_line(&words)
    }

    /// The peer of this end: "The agent is absent only when the call named a session that
    /// does not exist." (RW-02)
    pub fn peer(&self) -> Peer {
        match self {
            OtherEnd::Session { agent, .. } => Peer {
                kind: PeerKind::Session,
                agent: Some(*agent),
            },
            OtherEnd::NoSession => Peer {
                kind: PeerKind::Session,
                agent: None,
            },
            OtherEnd::ClaudeLead | OtherEnd::ClaudeSubagent { .. } => Peer {
                kind: PeerKind::Agent,
                agent: Some(AgentKind::Claude),
            },
            OtherEnd::OutsideClaude { .. } => Peer {
                kind: PeerKind::Session,
                agent: Some(AgentKind::Claude),
            },
            OtherEnd::CodexRoot | OtherEnd::CodexAgent { .. } => Peer {
                kind: PeerKind::Agent,
                agent: Some(AgentKind::Codex),
            },
        }
    }
}

/// The typed fact of a message row (RW-02).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageFact {
    /// Sent or received.
    pub direction: Direction,
    /// Message or task.
    pub kind: MessageKind,
    /// The sender's words.
    pub from: String,
    /// The recipient's words.
    pub to: String,
    /// The other end.
    pub peer: Peer,
    /// Only on a sent row whose call ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<MessageDelivery>,
    /// Only with `not-sent`: the first line of the reason, at most 220 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The other end, when a timeline of this host holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<MessageLink>,
    /// The call that sends it, while that call still runs (host-side; not on the wire).
    #[serde(skip)]
    pub running_call: Option<SendCall>,
}

/// A broken message-fact rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageRule {
    /// `from` or `to` is blank.
    BlankWords,
    /// `from` or `to` looks like an ID.
    IdAsWords,
    /// A task on a sent row.
    TaskOnSentRow,
    /// A delivery on a received row, or while the call runs.
    DeliveryWhereNone,
    /// A failure reason without `not-sent`.
    ReasonWithoutNotSent,
    /// A failure reason of more than one line or 220 characters.
    ReasonTooLong,
    /// The row title is not the fact's title.
    TitleNotFromFact,
    /// The signal does not follow the delivery.
    SignalNotFromDelivery,
    /// The peer has no agent, though the other end is not a session that does not exist
    /// (an agent, or words other than "Unknown session").
    AgentAbsent,
}

fn looks_like_id(s: &str) -> bool {
    let t = s.trim();
    let hexish = t.len() >= 16 && t.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    let prefixed = ["session-", "thread-", "run-", "msg_", "toolu_", "agent-"]
        .iter()
        .any(|p| t.starts_with(p) && !t.contains(' '));
    hexish || prefixed
}

impl MessageFact {
    /// A sent message from the showing end (`me`: "This session" / "This agent").
    pub fn sent(
        me: &str,
        to: &OtherEnd,
        delivery: Option<MessageDelivery>,
        reason: Option<&str>,
    ) -> MessageFact {
        MessageFact {
            direction: Direction::Sent,
            kind: MessageKind::Message,
            from: me.to_owned(),
            to: to.words(),
            peer: to.peer(),
            failure_reason: match delivery {
                Some(MessageDelivery::NotSent) => {
                    reason.map(|r| first_line_chars(r, FAILURE_REASON_MAX_CHARS))
                }
                _ => None,
            },
            delivery,
            link: None,
            running_call: None,
        }
    }

    /// A sent message whose queue entry the user removed: not sent, with the seed's
    /// reason.
    pub fn declined(me: &str, to: &OtherEnd) -> MessageFact {
        MessageFact::sent(
            me,
            to,
            Some(MessageDelivery::NotSent),
            Some(DECLINED_REASON),
        )
    }

    /// A received message (or task) at the showing end.
    pub fn received(me: &str, from: &OtherEnd, kind: MessageKind) -> MessageFact {
        MessageFact {
            direction: Direction::Received,
            kind,
            from: from.words(),
            to: me.to_owned(),
            peer: from.peer(),
            delivery: None,
            failure_reason: None,
            link: None,
            running_call: None,
        }
    }

    /// The row title (RW-04): "`Message to <to>`" on a sent row, also while its call runs;
    /// "`Message from <from>`" or "`Task from <from>`" on a received row.
    pub fn title(&self) -> String {
        match (self.direction, self.kind) {
            (Direction::Sent, _) => format!("Message to {}", self.to),
            (Direction::Received, MessageKind::Message) => format!("Message from {}", self.from),
            (Direction::Received, MessageKind::Task) => format!("Task from {}", self.from),
        }
    }

    /// The signal: Sent, Needs approval, Not sent; none while the call runs.
    pub fn signal(&self) -> Option<&'static str> {
        if self.running_call.is_some() {
            return None;
        }
        self.delivery.map(|d| match d {
            MessageDelivery::Sent => "Sent",
            MessageDelivery::NeedsApproval => "Needs approval",
            MessageDelivery::NotSent => "Not sent",
        })
    }

    /// Every broken rule of the fact.
    pub fn violations(&self) -> Vec<MessageRule> {
        let mut out = Vec::new();
        if self.from.trim().is_empty() || self.to.trim().is_empty() {
            out.push(MessageRule::BlankWords);
        }
        if looks_like_id(&self.from) || looks_like_id(&self.to) {
            out.push(MessageRule::IdAsWords);
        }
        if self.direction == Direction::Sent && self.kind == MessageKind::Task {
            out.push(MessageRule::TaskOnSentRow);
        }
        if self.delivery.is_some()
            && (self.direction == Direction::Received || self.running_call.is_some())
        {
            out.push(MessageRule::DeliveryWhereNone);
        }
        let other = match self.direction {
            Direction::Sent => &self.to,
            Direction::Received => &self.from,
        };
        if self.peer.agent.is_none()
            && (self.peer.kind == PeerKind::Agent || other.as_str() != UNKNOWN_SESSION)
        {
            out.push(MessageRule::AgentAbsent);
        }
        if let Some(r) = &self.failure_reason {
            if self.delivery != Some(MessageDelivery::NotSent) {
                out.push(MessageRule::ReasonWithoutNotSent);
            }
            if r.contains(is_line_break) || r.chars().count() > FAILURE_REASON_MAX_CHARS {
                out.push(MessageRule::ReasonTooLong);
            }
        }
        out
    }
}

// ----- the status row (RW-05) -----------------------------------------------------------

/// The phase label of a run's status row, from its newest activity row.
pub fn phase_label(newest: Option<ActivityKind>) -> &'static str {
    match newest {
        Some(ActivityKind::Reasoning) => "Reasoning",
        Some(ActivityKind::Command) => "Running command",
        Some(ActivityKind::FileChange) => "Editing files",
        Some(ActivityKind::FileRead | ActivityKind::Search) => "Reading",
        Some(ActivityKind::ToolCall) => "Using tool",
        Some(ActivityKind::Plan) => "Planning",
        _ => "Working",
    }
}

/// The status row of an active run: a `thinking` block `thinking-<runId>` placed at
/// `[2, startedAtMs]`, its label from the newest activity row.
pub fn status_row(
    run_id: &crate::key::RunId,
    started_at: crate::time::Millis,
    newest: Option<ActivityKind>,
) -> crate::block::Block {
    let key = crate::key::BlockKey::new(
        crate::key::BlockType::Thinking,
        crate::key::BlockId::prefixed("thinking-", run_id.as_str()),
    );
    crate::block::Block::new(key, started_at)
        .with_source_order(crate::order::SourceOrder::active_run_status(started_at))
        .with_data(serde_json::json!({ "label": phase_label(newest) }))
}

// ----- approvals (RW-06) ----------------------------------------------------------------

/// What an approval is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ApprovalKind {
    /// Running a command.
    CommandExecution,
    /// Changing files.
    FileChange,
    /// Wider permissions.
    Permissions,
}

/// A decision a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    /// Allow once.
    Accept,
    /// Allow for the session.
    AcceptForSession,
    /// Allow broadly.
    AcceptBroadly,
    /// Refuse what is asked.
    Decline,
    /// Cancel the turn.
    Cancel,
}

/// The outcome of an approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ApprovalResult {
    /// Allowed once.
    Accepted,
    /// Allowed for the session.
    AcceptedForSession,
    /// Allowed broadly.
    AcceptedBroadly,
    /// Refused by the user.
    Declined,
    /// Cancelled, with the turn.
    Cancelled,
    /// Settled elsewhere (shown as expired).
    ResolvedExternally,
}

impl ApprovalResult {
    /// The words on the decided card.
    pub fn label(self) -> &'static str {
        match self {
            ApprovalResult::Accepted => "Allowed",
            ApprovalResult::AcceptedForSession => "Allowed for this session",
            ApprovalResult::AcceptedBroadly => "Allowed broadly",
            ApprovalResult::Declined => "Denied",
            ApprovalResult::Cancelled => "Cancelled",
            ApprovalResult::ResolvedExternally => "Expired",
        }
    }
}

/// The status of an approval card: "Card status: pending, then the result.
/// resolvedExternally shows as expired." (RW-06)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum CardStatus {
    /// Waiting for a decision.
    Pending,
    /// Allowed once.
    Accepted,
    /// Allowed for the session.
    AcceptedForSession,
    /// Allowed broadly.
    AcceptedBroadly,
    /// Refused by the user.
    Declined,
    /// Cancelled, with the turn.
    Cancelled,
    /// Settled elsewhere ([`ApprovalResult::ResolvedExternally`]).
    Expired,
}

impl CardStatus {
    /// The status of a card with `result` (`None`: not decided yet).
    pub fn of(result: Option<ApprovalResult>) -> CardStatus {
        match result {
            None => CardStatus::Pending,
            Some(ApprovalResult::Accepted) => CardStatus::Accepted,
            Some(ApprovalResult::AcceptedForSession) => CardStatus::AcceptedForSession,
            Some(ApprovalResult::AcceptedBroadly) => CardStatus::AcceptedBroadly,
            Some(ApprovalResult::Declined) => CardStatus::Declined,
            Some(ApprovalResult::Cancelled) => CardStatus::Cancelled,
            Some(ApprovalResult::ResolvedExternally) => CardStatus::Expired,
        }
    }

    /// The signal of a card with this status: none while pending, else the words of the
    /// result ([`ApprovalResult::label`]).
    pub fn label(self) -> Option<&'static str> {
        let result = match self {
            CardStatus::Pending => return None,
            CardStatus::Accepted => ApprovalResult::Accepted,
            CardStatus::AcceptedForSession => ApprovalResult::AcceptedForSession,
            CardStatus::AcceptedBroadly => ApprovalResult::AcceptedBroadly,
            CardStatus::Declined => ApprovalResult::Declined,
            CardStatus::Cancelled => ApprovalResult::Cancelled,
            CardStatus::Expired => ApprovalResult::ResolvedExternally,
        };
        Some(result.label())
    }
}

/// The `approval` field of an approval card: the request it asks about, its card status,
/// and the result once decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalCard {
    /// The request (its fields sit beside `status` on the wire).
    #[serde(flatten)]
    pub request: ApprovalRequest,
    /// Pending, then the result; a request resolved elsewhere is expired.
    pub status: CardStatus,
    /// The result, once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ApprovalResult>,
}

/// The shared approval request of both agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The request.
    pub request_id: String,
    /// The thread.
    pub thread_id: String,
    /// The turn.
    pub turn_id: String,
    /// The item.
    pub item_id: String,
    /// What it is for.
    pub kind: ApprovalKind,
    /// The decisions this request allows.
    pub allowed: Vec<Decision>,
}

/// A decision outside the allowed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the decision {0:?} is not allowed for this request")]
pub struct DecisionNotAllowed(pub Decision);

/// A card ID that does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an approval card ID")]
pub struct BadCardId;

/// The prefix of approval card IDs.
pub const APPROVAL_ID_PREFIX: &str = "approval:";

impl ApprovalRequest {
    /// The result of `decision`, or a refusal when the request does not allow it.
    pub fn decide(&self, decision: Decision) -> Result<ApprovalResult, DecisionNotAllowed> {
        if !self.allowed.contains(&decision) {
            return Err(DecisionNotAllowed(decision));
        }
        Ok(match decision {
            Decision::Accept => ApprovalResult::Accepted,
            Decision::AcceptForSession => ApprovalResult::AcceptedForSession,
            Decision::AcceptBroadly => ApprovalResult::AcceptedBroadly,
            Decision::Decline => ApprovalResult::Declined,
            Decision::Cancel => ApprovalResult::Cancelled,
        })
    }

    /// The card ID: `approval:` then the request, thread, turn and item IDs, each as
    /// `<byte length>:<id>`. Pending and decided cards share it.
    pub fn card_id(&self) -> String {
        let mut s = String::from(APPROVAL_ID_PREFIX);
        for part in [
            &self.request_id,
            &self.thread_id,
            &self.turn_id,
            &self.item_id,
        ] {
            s.push_str(&part.len().to_string());
            s.push(':');
            s.push_str(part);
        }
        s
    }
}

/// The four IDs of a card ID: `(request, thread, turn, item)`.
pub fn parse_card_id(id: &str) -> Result<(String, String, String, String), BadCardId> {
    let mut rest = id.strip_prefix(APPROVAL_ID_PREFIX).ok_or(BadCardId)?;
    let mut parts = Vec::with_capacity(4);
    for _ in 0..4 {
        let (len, tail) = rest.split_once(':').ok_or(BadCardId)?;
        if len.is_empty()
            || !len.bytes().all(|b| b.is_ascii_digit())
            || (len.len() > 1 && len.starts_with('0'))
        {
            return Err(BadCardId);
        }
        let n: usize = len.parse().map_err(|_| BadCardId)?;
        let part = tail.get(..n).ok_or(BadCardId)?;
        parts.push(part.to_owned());
        rest = &tail[n..];
    }
    if !rest.is_empty() {
        return Err(BadCardId);
    }
    let mut it = parts.into_iter();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(a), Some(b), Some(c), Some(d)) => Ok((a, b, c, d)),
        _ => Err(BadCardId),
    }
}

/// The card of an approval (RW-06): "The card is a live activity row of kind event."
/// Its title names what is asked, the first line of the summary is its context line, its
/// `approval` field carries the request and the card status (pending, then the result;
/// resolved elsewhere: expired), and its signal is the words of that status once decided.
pub fn approval_card(
    request: &ApprovalRequest,
    summary: &str,
    result: Option<ApprovalResult>,
) -> ActivityRow {
    let title = match request.kind {
        ApprovalKind::CommandExecution => "Approve command",
        ApprovalKind::FileChange => "Approve file change",
        ApprovalKind::Permissions => "Approve permissions",
    };
    let status = CardStatus::of(result);
    let signal = status.label();
    ActivityRow {
        kind: ActivityKind::Event,
        title: title.to_owned(),
        subtitle: summary_line(Some(summary), title, signal),
        display: Display {
            signal: signal.map(str::to_owned),
        },
        status: match result {
            None => RowStatus::InProgress,
            Some(ApprovalResult::Declined | ApprovalResult::Cancelled) => RowStatus::Declined,
            Some(_) => RowStatus::Completed,
        },
        detail: None,
        message: None,
        approval: Some(ApprovalCard {
            request: request.clone(),
            status,
            result,
        }),
    }
}

// ----- a row as one line of plain text ----------------------------------------------------

/// A row as one line a person reads, for logs, terminals and tests: who said what
/// (`You: …`, `Agent: …`), an activity row's title with its context line and signal
/// (`ls — src (Exit 0)`), reasoning and notices marked as such. Only the first line of a
/// text is kept. The words are the row's own (RW-01): nothing is made up beyond the
/// speaker's name and the separators.
pub fn plain_text(block: &crate::block::Block) -> String {
    use crate::key::BlockType;
    let text = first_line(
        block
            .data
            .get("text")
            .and_then(|t| t.as_str())
            .unwrap_or(""),
    );
    match block.block_type {
        BlockType::User => format!("You: {text}"),
        BlockType::AgentReply => format!("Agent: {text}"),
        BlockType::Thinking => format!("(thinking) {text}"),
        BlockType::System => format!("[{text}]"),
        BlockType::Activity => match serde_json::from_value::<ActivityRow>(block.data.clone()) {
            Ok(row) => {
                let mut line = row.title;
                if let Some(sub) = row.subtitle.filter(|s| !s.is_empty()) {
                    line.push_str(" — ");
                    line.push_str(first_line(&sub));
                }
                if let Some(signal) = row.display.signal {
                    line.push_str(&format!(" ({signal})"));
                }
                line
            }
            Err(_) => format!("[activity {}]", block.id),
        },
    }
}
