//! The fields of a transcript entry that prove messages delivered, and the one rule that
//! reads them ([`Marks::delivered`], described in [`crate::proof`]): shared by the
//! whole-file reader (`transcript`) and the line-by-line scan (`proof`).

use serde::Deserialize;
use serde_json::Value;

/// The `attachment` object of a transcript `attachment` entry, as far as this crate
/// reads it. Every field is read as any JSON value, so an attachment of another type
/// whose fields have other shapes never makes its line malformed.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct Attachment {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    /// The message text of a `queued_command` (a string, or content blocks).
    #[serde(default)]
    pub(crate) prompt: Option<Value>,
    #[serde(default)]
    source_uuid: Option<Value>,
    #[serde(default, rename = "commandMode")]
    command_mode: Option<Value>,
    #[serde(default, rename = "isMeta")]
    is_meta: Option<Value>,
}

fn text_of(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.trim().is_empty())
}

impl Attachment {
    /// True for a `queued_command`: a message that joined a running turn.
    pub(crate) fn is_queued_command(&self) -> bool {
        text_of(self.kind.as_ref()) == Some("queued_command")
    }

    /// The UUID of the message a `queued_command` carries (`source_uuid`), when it
    /// names one (interactive sessions of older versions do not).
    pub(crate) fn source_uuid(&self) -> Option<&str> {
        if self.is_queued_command() {
            text_of(self.source_uuid.as_ref())
        } else {
            None
        }
    }

    /// True when a `queued_command` is the user's words: not meta, not a background
    /// task's notification.
    pub(crate) fn is_users_message(&self) -> bool {
        self.is_queued_command()
            && self.is_meta.as_ref().and_then(Value::as_bool) != Some(true)
            && text_of(self.command_mode.as_ref()) != Some("task-notification")
    }
}

/// The fields of one transcript entry that name the messages it proves delivered
/// (borrowed from whichever struct the caller decoded the line into).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Marks<'a> {
    /// `type`.
    pub(crate) kind: &'a str,
    /// `uuid`.
    pub(crate) uuid: Option<&'a str>,
    /// `mergedSendUuids` (a user entry).
    pub(crate) merged_send_uuids: Option<&'a Value>,
    /// `operation`, `reason` and `commandUuid` (a queue operation).
    pub(crate) operation: Option<&'a Value>,
    pub(crate) reason: Option<&'a Value>,
    pub(crate) command_uuid: Option<&'a Value>,
    /// `attachment` (an attachment entry).
    pub(crate) attachment: Option<&'a Attachment>,
}

impl<'a> Marks<'a> {
    /// Calls `f` with every message UUID this entry proves delivered (see the module
    /// doc), blank ones left out.
    pub(crate) fn delivered(&self, mut f: impl FnMut(&'a str)) {
        match self.kind {
            "user" => {
                if let Some(u) = self.uuid.filter(|u| !u.trim().is_empty()) {
                    f(u);
                }
                if let Some(Value::Array(merged)) = self.merged_send_uuids {
                    merged.iter().filter_map(|v| text_of(Some(v))).for_each(f);
                }
            }
            "attachment" => {
                if let Some(u) = self.attachment.and_then(Attachment::source_uuid) {
                    f(u);
                }
            }
            "queue-operation"
                if text_of(self.operation) == Some("remove")
                    && text_of(self.reason) == Some("absorbed_mid_turn") =>
            {
                if let Some(u) = text_of(self.command_uuid) {
                    f(u);
                }
            }
            _ => {}
        }
    }
}
