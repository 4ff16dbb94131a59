//! Anchors (TL-11): how a load names the place to open.
//!
//! A client sends one typed [`Anchor`]: a `link` token from a message row, a `newer`
//! token from an earlier answer, or a `row` key. Tokens are opaque to clients: `ta1.`
//! followed by the sealed JSON the host wrote ([`AnchorToken`]). A blank token or row key
//! is an invalid-params error; a token of the other kind, or one the host did not write
//! (the MAC under [`HostKey`] does not match), fails with "The timeline anchor is
//! invalid; reload the timeline".
//!
//! ```
//! use timeline_core::anchor::{Anchor, AnchorToken, LinkPlace};
//! use timeline_core::key::{BlockKey, BlockType};
//! use timeline_core::seal::HostKey;
//!
//! let key = HostKey::from_bytes([9; 32]);
//! let place = LinkPlace {
//!     app_session_id: Some("session-b".into()),
//!     thread_id: None,
//!     row: BlockKey::parse(BlockType::User, "user-message::op-7").unwrap(),
//! };
//! let token = AnchorToken::Link(place.clone()).encode(&key);
//! let anchor = Anchor::Link { token };
//! anchor.check_params().unwrap();
//! let Anchor::Link { token } = &anchor else { unreachable!() };
//! assert_eq!(AnchorToken::decode_link(token, &key), Ok(place));
//! ```

use serde::{Deserialize, Serialize};

use crate::cursor::BoundaryToken;
use crate::key::{BlockKey, BlockType};
use crate::seal::HostKey;

/// The prefix of every anchor token.
pub const ANCHOR_TOKEN_PREFIX: &str = "ta1.";
const ANCHOR_DOMAIN: &str = "ta1";

/// The text of [`AnchorError::Invalid`].
pub const INVALID_ANCHOR_TEXT: &str = "The timeline anchor is invalid; reload the timeline";

/// Why an anchor was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnchorError {
    /// A blank token, a blank row key or an unknown row type: invalid params on the
    /// relay, a validation error in the desktop window.
    #[error("invalid params: {0}")]
    InvalidParams(&'static str),
    /// A token of the other kind, or a text the host did not write.
    #[error("The timeline anchor is invalid; reload the timeline")]
    Invalid,
}

/// The row of a `row` anchor, as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RowRef {
    /// The block type name.
    #[serde(rename = "type")]
    pub block_type: String,
    /// The block ID.
    pub id: String,
}

/// The anchor a client sends with a load (wire form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Anchor {
    /// `message.link.anchor` of a message row.
    Link {
        /// The opaque token.
        token: String,
    },
    /// The `newerCursor` of an earlier answer for the same timeline.
    Newer {
        /// The opaque token.
        token: String,
    },
    /// A row of the timeline that loads, as an answer named it.
    Row {
        /// Its type and ID.
        row: RowRef,
    },
}

impl Anchor {
    /// A `row` anchor at `key`.
    pub fn row(key: &BlockKey) -> Anchor {
        Anchor::Row {
            row: RowRef {
                block_type: key.block_type.as_str().to_owned(),
                id: key.id.as_str().to_owned(),
            },
        }
    }

    /// Refuses blank tokens and blank or unknown row keys.
    pub fn check_params(&self) -> Result<(), AnchorError> {
        match self {
            Anchor::Link { token } | Anchor::Newer { token } if token.trim().is_empty() => {
                Err(AnchorError::InvalidParams("anchor token must not be blank"))
            }
            Anchor::Row { .. } => self.row_key().map(|_| ()),
            _ => Ok(()),
        }
    }

    /// The typed key of a `row` anchor; `None` for token anchors.
    pub fn row_key(&self) -> Result<BlockKey, AnchorError> {
        let Anchor::Row { row } = self else {
            return Err(AnchorError::Invalid);
        };
        if row.block_type.trim().is_empty() || row.id.trim().is_empty() {
            return Err(AnchorError::InvalidParams(
                "anchor row key must not be blank",
            ));
        }
        let t: BlockType = row
            .block_type
            .parse()
            .map_err(|_| AnchorError::InvalidParams("anchor row type is unknown"))?;
        BlockKey::parse(t, &row.id)
            .map_err(|_| AnchorError::InvalidParams("anchor row key must not be blank"))
    }

    /// True for `link` and `row` anchors, whose answers carry exactly one of `anchorRow`
    /// and `anchorNotice`.
    pub fn opens_a_place(&self) -> bool {
        !matches!(self, Anchor::Newer { .. })
    }
}

/// Where a link points: the other end of a message row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LinkPlace {
    /// The session; `None` means the session that shows the row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_session_id: Option<String>,
    /// The thread; `None` means the main timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The row to open.
    pub row: BlockKey,
}

/// Where a `newer` load continues: right after the last row of a page in the past.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NewerPlace {
    /// The timeline target the page belongs to.
    pub target: String,
    /// The history source the page was read from.
    pub source_token: BoundaryToken,
    /// The last (newest) row of the page.
    pub after: BlockKey,
    /// The host's position in its source after that row, if it keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
}

/// What an anchor token says, sealed by the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum AnchorToken {
    /// A `link` token.
    Link(LinkPlace),
    /// A `newer` token.
    Newer(NewerPlace),
}

impl AnchorToken {
    /// The token text: `ta1.` + base64url JSON + `.` + base64url MAC.
    pub fn encode(&self, key: &HostKey) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{ANCHOR_TOKEN_PREFIX}{}", key.seal(ANCHOR_DOMAIN, &json))
    }

    fn decode(text: &str, key: &HostKey) -> Result<AnchorToken, AnchorError> {
        if text.trim().is_empty() {
            return Err(AnchorError::InvalidParams("anchor token must not be blank"));
        }
        let sealed = text
            .strip_prefix(ANCHOR_TOKEN_PREFIX)
            .ok_or(AnchorError::Invalid)?;
        let json = key
            .open(ANCHOR_DOMAIN, sealed)
            .ok_or(AnchorError::Invalid)?;
        serde_json::from_slice(&json).map_err(|_| AnchorError::Invalid)
    }

    /// Decodes a `link` token; a `newer` token fails as invalid.
    pub fn decode_link(text: &str, key: &HostKey) -> Result<LinkPlace, AnchorError> {
        match Self::decode(text, key)? {
            AnchorToken::Link(place) => Ok(place),
            AnchorToken::Newer(_) => Err(AnchorError::Invalid),
        }
    }

    /// Decodes a `newer` token; a `link` token fails as invalid.
    pub fn decode_newer(text: &str, key: &HostKey) -> Result<NewerPlace, AnchorError> {
        match Self::decode(text, key)? {
            AnchorToken::Newer(place) => Ok(place),
            AnchorToken::Link(_) => Err(AnchorError::Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> HostKey {
        HostKey::from_bytes([5; 32])
    }

    fn newer() -> NewerPlace {
        NewerPlace {
            target: "s1".into(),
            source_token: BoundaryToken::claude("s1"),
            after: BlockKey::parse(BlockType::AgentReply, "r9").unwrap(),
            position: None,
        }
    }

    // TL-11
    #[test]
    fn a_token_of_the_other_kind_is_invalid_with_the_seed_text() {
        let t = AnchorToken::Newer(newer()).encode(&key());
        let err = AnchorToken::decode_link(&t, &key()).unwrap_err();
        assert_eq!(err, AnchorError::Invalid);
        assert_eq!(err.to_string(), INVALID_ANCHOR_TEXT);
        assert_eq!(AnchorToken::decode_newer(&t, &key()), Ok(newer()));
    }

    // TL-11
    #[test]
    fn a_text_the_host_did_not_write_is_invalid() {
        let forged_json = br#"{"kind":"newer","target":"s1","sourceToken":"s1","after":{"type":"agent-reply","id":"r9"}}"#;
        use base64::Engine as _;
        let forged = format!(
            "ta1.{}.AAAA",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged_json)
        );
        assert_eq!(
            AnchorToken::decode_newer(&forged, &key()),
            Err(AnchorError::Invalid)
        );
        assert_eq!(
            AnchorToken::decode_newer("hello", &key()),
            Err(AnchorError::Invalid)
        );
        let other = AnchorToken::Newer(newer()).encode(&HostKey::from_bytes([6; 32]));
        assert_eq!(
            AnchorToken::decode_newer(&other, &key()),
            Err(AnchorError::Invalid)
        );
    }

    // TL-11
    #[test]
    fn blank_tokens_and_row_keys_are_invalid_params() {
        for a in [
            Anchor::Link { token: "".into() },
            Anchor::Newer { token: "  ".into() },
            Anchor::Row {
                row: RowRef {
                    block_type: "user".into(),
                    id: " ".into(),
                },
            },
            Anchor::Row {
                row: RowRef {
                    block_type: "".into(),
                    id: "x".into(),
                },
            },
        ] {
            assert!(
                matches!(a.check_params(), Err(AnchorError::InvalidParams(_))),
                "{a:?}"
            );
        }
        assert!(matches!(
            AnchorToken::decode_link("", &key()),
            Err(AnchorError::InvalidParams(_))
        ));
        let ok: Anchor =
            serde_json::from_str(r#"{"kind":"row","row":{"type":"agent-reply","id":"r1"}}"#)
                .unwrap();
        assert_eq!(ok.row_key().unwrap().encoded(), "agent-reply\0r1");
    }
}
