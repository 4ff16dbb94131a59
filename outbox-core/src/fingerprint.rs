//! The request fingerprint (OB-02) and the admission input digest (OB-07).
//!
//! Both are SHA-256 over an unambiguous encoding: every field is written as a one-byte
//! tag, then its length as eight big-endian bytes, then its bytes; absent optional
//! fields get their own tag. Two different requests therefore never hash the same
//! input, even when the naive concatenation of their fields is equal
//! (`"ab" + "c"` vs `"a" + "bc"`).
//!
//! The fingerprint covers sessionId, queueId, userText, promptText, attachments,
//! threadId, speedMode, accessMode, the expected model and effort, rollbackBeforeSend,
//! source and createdAt. It leaves out intent, sendMode and expectedActiveRunId, so
//! queueing a message and then sending it now converges on one operation, while
//! retargeting a steer to another run changes the controls, not the fingerprint
//! (and is refused as a conflict by the submit, see [`crate::custody`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::entry::MessageRequest;
use crate::ids::{QueueId, SessionId};

/// A SHA-256 digest, hex on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Digest256(String);

impl Digest256 {
    fn from_hasher(h: Sha256) -> Digest256 {
        Digest256(timeline_core::seal::hex(&h.finalize()))
    }

    /// The hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A digest read back from storage.
    pub fn from_hex(hex: impl Into<String>) -> Digest256 {
        Digest256(hex.into())
    }
}

/// Length-prefixed field writer.
struct Fields(Sha256);

impl Fields {
    fn new(domain: &str) -> Fields {
        let mut f = Fields(Sha256::new());
        f.bytes(0, domain.as_bytes());
        f
    }

    fn bytes(&mut self, tag: u8, b: &[u8]) {
        self.0.update([tag]);
        self.0.update((b.len() as u64).to_be_bytes());
        self.0.update(b);
    }

    fn opt(&mut self, tag: u8, s: Option<&str>) {
        match s {
            Some(s) => self.bytes(tag, s.as_bytes()),
            None => self.0.update([tag | 0x80]),
        }
    }
}

/// The request fingerprint of a submit (OB-02).
pub fn request_fingerprint(
    session: &SessionId,
    queue: &QueueId,
    request: &MessageRequest,
) -> Digest256 {
    let mut f = Fields::new("outbox-request-v1");
    f.bytes(1, session.as_str().as_bytes());
    f.bytes(2, queue.as_str().as_bytes());
    f.bytes(3, request.user_text.as_bytes());
    f.opt(4, request.prompt_text.as_deref());
    f.bytes(5, &(request.attachments.len() as u64).to_be_bytes());
    for a in &request.attachments {
        f.bytes(6, a.path.as_bytes());
        f.bytes(7, a.kind.as_bytes());
    }
    f.opt(8, request.thread_id.as_ref().map(|t| t.as_str()));
    f.opt(9, request.speed_mode.as_deref());
    f.opt(10, request.access_mode.map(|a| a.as_str()));
    f.opt(11, request.expected_model.as_deref());
    f.opt(12, request.expected_effort.as_deref());
    f.bytes(13, &[u8::from(request.rollback_before_send)]);
    f.bytes(14, request.source.as_bytes());
    f.bytes(15, &request.created_at.as_u64().to_be_bytes());
    Digest256::from_hasher(f.0)
}

/// `admission_input_digest` (OB-07): SHA-256 over the text with normalized line ends
/// (`\r\n` and `\r` become `\n`) and the ordered image paths.
pub fn admission_input_digest(text: &str, image_paths: &[&str]) -> Digest256 {
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut f = Fields::new("admission-input-v1");
    f.bytes(1, normalized.as_bytes());
    f.bytes(2, &(image_paths.len() as u64).to_be_bytes());
    for p in image_paths {
        f.bytes(3, p.as_bytes());
    }
    Digest256::from_hasher(f.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // OB-02: a digest is the lower-case hex of SHA-256 (a known answer: the empty input).
    #[test]
    fn digests_are_lower_case_sha256_hex() {
        assert_eq!(
            Digest256::from_hasher(Sha256::new()).as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
