//! The wire block: one row of a timeline as clients receive it, and the typed payload of
//! a command row (TL-14).
//!
//! A block's identity is its [`BlockKey`]; its timestamp and source order only place it.
//! Everything else a row says lives in `data`, which the timeline reducer carries but
//! never reads, so building or reconciling a timeline never touches command output.

use serde::{Deserialize, Serialize};

use crate::key::{BlockId, BlockKey, BlockType, OperationId};
use crate::order::{OrderKey, SourceOrder};
use crate::time::Millis;

/// One timeline row on the wire (camelCase JSON). Unknown fields are ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// The block type.
    #[serde(rename = "type")]
    pub block_type: BlockType,
    /// The ID, unique within the type.
    pub id: BlockId,
    /// When the row happened, in milliseconds.
    pub timestamp: Millis,
    /// The host's tie-breaker (TL-05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_order: Option<SourceOrder>,
    /// The message operation this row carries, if any (TL-03).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<OperationId>,
    /// What the row shows; opaque to the reducers.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl Block {
    /// A block with no source order, no operation and no data.
    pub fn new(key: BlockKey, timestamp: Millis) -> Block {
        Block {
            block_type: key.block_type,
            id: key.id,
            timestamp,
            source_order: None,
            operation_id: None,
            data: serde_json::Value::Null,
        }
    }

    /// Sets the source order.
    #[must_use]
    pub fn with_source_order(mut self, order: SourceOrder) -> Block {
        self.source_order = Some(order);
        self
    }

    /// Sets the operation the row carries.
    #[must_use]
    pub fn with_operation(mut self, op: OperationId) -> Block {
        self.operation_id = Some(op);
        self
    }

    /// Sets the data.
    #[must_use]
    pub fn with_data(mut self, data: serde_json::Value) -> Block {
        self.data = data;
        self
    }

    /// The identity key.
    pub fn key(&self) -> BlockKey {
        BlockKey::new(self.block_type, self.id.clone())
    }

    /// The sort key (TL-04).
    pub fn order_key(&self) -> OrderKey {
        OrderKey {
            timestamp: self.timestamp,
            source_order: self.source_order.clone(),
            key: self.key(),
        }
    }
}

/// Where a command's output is (TL-14): a row carries a descriptor or the text the agent
/// retained, never bytes read for it. An open viewer fetches artifact bytes separately.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
#[non_exhaustive]
pub enum CommandOutput {
    /// Output stored elsewhere, named by a descriptor.
    #[serde(rename_all = "camelCase")]
    Artifact {
        /// The artifact's ID in the host's store.
        artifact_id: String,
        /// Its size, so a viewer can decide how to open it.
        byte_length: u64,
    },
    /// The output the agent kept in its transcript.
    Retained {
        /// The retained text.
        text: String,
    },
}

/// The `data` of a command row (TL-14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CommandRowData {
    /// The command text.
    pub command: String,
    /// Where its output is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<CommandOutput>,
}
