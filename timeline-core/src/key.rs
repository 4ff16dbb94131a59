//! Typed identity (TL-01). A block is identified by its type and its ID, nothing else:
//! timestamps and text are never identity. The key owns its encoding (`type`, a NUL byte,
//! the ID); no other code builds that string.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which agent a session runs: Codex or Claude. One type for every place that names an
/// agent (capabilities, the other end of a message, envelopes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// OpenAI Codex, driven through its app-server.
    Codex,
    /// Anthropic Claude Code, driven through its stream-json mode.
    Claude,
    /// Any agent driven through the Agent Client Protocol.
    Acp,
}

/// The five block types. A block ID is unique only within its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum BlockType {
    /// A message of the user (or one another session sent).
    User,
    /// A system notice.
    System,
    /// A command, tool call, file change, message between sessions, approval card.
    Activity,
    /// Reply text of the agent.
    AgentReply,
    /// Reasoning of the agent, and the status row of an active run.
    Thinking,
}

impl BlockType {
    /// Every block type.
    pub const ALL: [BlockType; 5] = [
        BlockType::User,
        BlockType::System,
        BlockType::Activity,
        BlockType::AgentReply,
        BlockType::Thinking,
    ];

    /// The wire name (`user`, `system`, `activity`, `agent-reply`, `thinking`).
    pub const fn as_str(self) -> &'static str {
        match self {
            BlockType::User => "user",
            BlockType::System => "system",
            BlockType::Activity => "activity",
            BlockType::AgentReply => "agent-reply",
            BlockType::Thinking => "thinking",
        }
    }
}

impl fmt::Display for BlockType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A malformed identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The type is not one of the five block types.
    #[error("unknown block type {0:?}")]
    UnknownType(String),
    /// The ID is empty or only whitespace.
    #[error("a block ID must not be blank")]
    BlankId,
    /// An encoded key without the NUL separator.
    #[error("an encoded block key must be a type, a NUL byte and an ID")]
    MissingSeparator,
    /// An identifier that must not be blank was blank.
    #[error("{0} must not be blank")]
    Blank(&'static str),
}

impl FromStr for BlockType {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BlockType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| KeyError::UnknownType(s.to_owned()))
    }
}

/// The JSON Schema of an identity newtype (feature `schema`): a string that is not blank.
#[cfg(feature = "schema")]
#[doc(hidden)]
#[macro_export]
macro_rules! __id_schema {
    ($name:ident, $what:literal) => {
        impl $crate::__schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                ::std::borrow::Cow::Borrowed(stringify!($name))
            }

            fn json_schema(
                _: &mut $crate::__schemars::SchemaGenerator,
            ) -> $crate::__schemars::Schema {
                $crate::__schemars::json_schema!({
                    "type": "string",
                    "description": concat!("A ", $what, ": text that is not blank."),
                    "pattern": "\\S"
                })
            }
        }
    };
}

/// Without the `schema` feature an identity has no JSON Schema.
#[cfg(not(feature = "schema"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __id_schema {
    ($name:ident, $what:literal) => {};
}

/// Defines a text identity newtype the way every ID of this workspace is made: it refuses
/// blank text with [`KeyError::Blank`], serializes as a plain string, and deserializing
/// runs the same check. Other crates of the workspace use it for their own IDs.
#[macro_export]
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ::serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("A ", $what, "; blank text is refused.")]
            pub fn new(
                value: impl Into<String>,
            ) -> ::std::result::Result<Self, $crate::key::KeyError> {
                let value = value.into();
                if value.trim().is_empty() {
                    return Err($crate::key::KeyError::Blank($what));
                }
                Ok(Self(value))
            }

            /// The text of the identifier.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl ::std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        $crate::__id_schema!($name, $what);

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                $name::new(s).map_err(::serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// The ID of a block, unique only within its [`BlockType`].
    BlockId,
    "block ID"
);
string_id!(
    /// The immutable ID of one message operation, kept across delivery and recovery.
    OperationId,
    "operation ID"
);
string_id!(
    /// A timeline target: the session for the main conversation, the thread or subagent
    /// ID for a child.
    TargetId,
    "timeline target ID"
);
string_id!(
    /// An app session: one conversation of the host, owner of an outbox and overlays.
    SessionId,
    "session ID"
);
string_id!(
    /// One run of an agent in a session (`run-<uuid>-<milliseconds>` when the host makes
    /// it with [`RunId::generate`]).
    RunId,
    "run ID"
);

impl RunId {
    /// `run-<uuid>-<startedAtMs>`. The UUID comes from the host (the cores draw no
    /// randomness).
    pub fn generate(uuid: &str, started_at: crate::time::Millis) -> RunId {
        RunId(format!("run-{uuid}-{}", started_at.as_u64()))
    }

    /// The milliseconds at the end of a generated run ID, if it has that form.
    pub fn started_at(&self) -> Option<crate::time::Millis> {
        let rest = self.0.strip_prefix("run-")?;
        let (_, ms) = rest.rsplit_once('-')?;
        ms.parse().ok().map(crate::time::Millis)
    }
}

impl BlockId {
    /// `prefix` + `id`: never blank while `prefix` is not.
    pub(crate) fn prefixed(prefix: &'static str, id: &str) -> BlockId {
        BlockId(format!("{prefix}{id}"))
    }
}

impl TargetId {
    /// The target of a session's main conversation: the session itself.
    pub fn main(session: &SessionId) -> TargetId {
        TargetId(session.0.clone())
    }
}

/// The identity of a block: its type and its ID. Two blocks with the same key are two
/// copies of one row.
///
/// Keys order like their encoded strings (type name, NUL, ID), which is the last
/// tie-breaker of the canonical order (TL-04).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BlockKey {
    /// The block type.
    #[serde(rename = "type")]
    pub block_type: BlockType,
    /// The ID within that type.
    pub id: BlockId,
}

/// The prefix of the ID a user row gets from its operation (TL-03).
pub const USER_MESSAGE_ID_PREFIX: &str = "user-message::";

impl BlockKey {
    /// A key from its parts.
    pub fn new(block_type: BlockType, id: BlockId) -> BlockKey {
        BlockKey { block_type, id }
    }

    /// A key from a type and raw ID text; blank IDs are refused.
    pub fn parse(block_type: BlockType, id: &str) -> Result<BlockKey, KeyError> {
        Ok(BlockKey::new(block_type, BlockId::new(id)?))
    }

    /// The key the history row of operation `op` will have: `user` +
    /// `user-message::<operationId>` (TL-03).
    pub fn user_message(op: &OperationId) -> BlockKey {
        BlockKey {
            block_type: BlockType::User,
            id: BlockId(format!("{USER_MESSAGE_ID_PREFIX}{}", op.as_str())),
        }
    }

    /// The encoded key: type name, a NUL byte, the ID.
    pub fn encoded(&self) -> String {
        let mut s = String::with_capacity(self.block_type.as_str().len() + 1 + self.id.0.len());
        s.push_str(self.block_type.as_str());
        s.push('\0');
        s.push_str(&self.id.0);
        s
    }

    /// Parses an encoded key. The first NUL separates the type from the ID; the ID may
    /// hold further NUL bytes.
    pub fn decode(encoded: &str) -> Result<BlockKey, KeyError> {
        let (t, id) = encoded.split_once('\0').ok_or(KeyError::MissingSeparator)?;
        BlockKey::parse(t.parse()?, id)
    }
}

impl Ord for BlockKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // No type name is a prefix of another and none holds a NUL byte, so comparing the
        // type names and then the IDs equals comparing the encoded strings.
        self.block_type
            .as_str()
            .cmp(other.block_type.as_str())
            .then_with(|| self.id.0.cmp(&other.id.0))
    }
}

impl PartialOrd for BlockKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.block_type, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // TL-01
    #[test]
    fn the_same_id_under_two_types_is_two_keys() {
        let a = BlockKey::parse(BlockType::Activity, "item-7").unwrap();
        let b = BlockKey::parse(BlockType::AgentReply, "item-7").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.encoded(), "activity\0item-7");
        assert_eq!(BlockKey::decode(&a.encoded()).unwrap(), a);
    }

    // TL-01
    #[test]
    fn key_order_equals_encoded_string_order() {
        let mut keys = Vec::new();
        for t in BlockType::ALL {
            for id in ["a", "a\0b", "b", "item-10", "item-9"] {
                keys.push(BlockKey::parse(t, id).unwrap());
            }
        }
        for a in &keys {
            for b in &keys {
                assert_eq!(a.cmp(b), a.encoded().cmp(&b.encoded()), "{a} vs {b}");
            }
        }
    }

    // TL-01
    #[test]
    fn blank_ids_and_unknown_types_are_refused() {
        assert_eq!(BlockId::new(" "), Err(KeyError::Blank("block ID")));
        assert!(matches!(
            BlockKey::decode("reply\0x"),
            Err(KeyError::UnknownType(_))
        ));
        assert_eq!(BlockKey::decode("user"), Err(KeyError::MissingSeparator));
        let err = serde_json::from_str::<BlockKey>(r#"{"type":"user","id":""}"#);
        assert!(err.is_err());
    }

    // TL-03
    #[test]
    fn user_message_key_follows_the_operation() {
        let op = OperationId::new("op-41").unwrap();
        assert_eq!(
            BlockKey::user_message(&op).encoded(),
            "user\0user-message::op-41"
        );
    }
}
