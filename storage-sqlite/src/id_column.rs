//! How the two tables a submit writes store their IDs (schema version 4).

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use timeline_core::seal::{hex, unhex};

/// Characters in a canonical UUID: 32 hex digits and four dashes.
const UUID_TEXT: usize = 36;
/// Bytes in a UUID.
const UUID_BYTES: usize = 16;
/// Where the dashes of a canonical UUID stand.
const DASHES: [usize; 4] = [8, 13, 18, 23];

/// A session, queue or operation ID as `workspace_chat_outbox` and
/// `workspace_chat_outbox_operation_identity` store it.
///
/// An ID whose last 36 characters are a canonical UUID (lower-case hex in groups of
/// 8-4-4-4-12) is stored as a BLOB: the UTF-8 bytes before the UUID, then the UUID's 16
/// bytes. Any other ID is stored as its text. [`read_id`] turns either back into the
/// exact text, and two IDs are equal exactly when their stored values are, so keys and
/// unique constraints on these columns mean what they would mean on the text. Use it
/// to query those two tables directly:
///
/// ```
/// use storage_sqlite::{read_id, IdColumn};
///
/// let conn = rusqlite::Connection::open_in_memory().unwrap();
/// let id = "session-message-0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5e";
/// let stored: Vec<u8> = conn
///     .query_row("SELECT ?1", [IdColumn(id)], |r| r.get(0))
///     .unwrap();
/// assert_eq!(stored.len(), "session-message-".len() + 16);
/// let back = conn
///     .query_row("SELECT ?1", [IdColumn(id)], |r| Ok(read_id(r.get_ref(0)?)))
///     .unwrap();
/// assert_eq!(back.as_deref(), Ok(id));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Public API only with the `testing` feature; the crate's own code uses it either way.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct IdColumn<'a>(pub &'a str);

#[cfg(any(test, feature = "testing"))]
impl IdColumn<'_> {
    /// The value stored for the ID.
    pub fn value(&self) -> Value {
        uuid_blob(self.0).map_or_else(|| Value::Text(self.0.to_owned()), Value::Blob)
    }
}

impl rusqlite::ToSql for IdColumn<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match uuid_blob(self.0) {
            Some(blob) => ToSqlOutput::Owned(Value::Blob(blob)),
            None => ToSqlOutput::Borrowed(ValueRef::Text(self.0.as_bytes())),
        })
    }
}

/// The BLOB for an ID that ends in a canonical UUID: the bytes before it, then its 16
/// bytes.
fn uuid_blob(id: &str) -> Option<Vec<u8>> {
    let text = id.as_bytes();
    let split = text.len().checked_sub(UUID_TEXT)?;
    let uuid = uuid_bytes(&text[split..])?;
    let mut blob = Vec::with_capacity(split + UUID_BYTES);
    blob.extend_from_slice(&text[..split]);
    blob.extend_from_slice(&uuid);
    Some(blob)
}

/// The 16 bytes of a canonical UUID's text; `None` for any other text (upper case,
/// braces, missing or misplaced dashes).
fn uuid_bytes(text: &[u8]) -> Option<[u8; UUID_BYTES]> {
    if text.len() != UUID_TEXT || DASHES.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let digits: String = text
        .iter()
        .enumerate()
        .filter(|(i, _)| !DASHES.contains(i))
        .map(|(_, &c)| char::from(c))
        .collect();
    unhex(&digits)?.try_into().ok()
}

/// The ID behind a value [`IdColumn`] stored: text as it is; a BLOB as the UTF-8 text
/// of all but its last 16 bytes followed by those 16 bytes as a canonical UUID. Any
/// other value is an error that says what was found.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn read_id(value: ValueRef<'_>) -> Result<String, String> {
    match value {
        ValueRef::Text(text) => {
            String::from_utf8(text.to_vec()).map_err(|_| "the ID is not UTF-8 text".to_owned())
        }
        ValueRef::Blob(blob) => {
            let Some(split) = blob.len().checked_sub(UUID_BYTES) else {
                return Err(format!(
                    "the ID is a {}-byte BLOB, shorter than a UUID",
                    blob.len()
                ));
            };
            let prefix = std::str::from_utf8(&blob[..split])
                .map_err(|_| "the ID's text before its UUID is not UTF-8".to_owned())?;
            let h = hex(&blob[split..]);
            Ok(format!(
                "{prefix}{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        other => Err(format!("the ID is {}", other.data_type())),
    }
}

/// How a stored value that [`read_id`] refuses is shown: text as it is (invalid UTF-8
/// replaced), a BLOB in SQL's `X'..'` notation, anything else by its type.
pub(crate) fn shown(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Text(text) => String::from_utf8_lossy(text).into_owned(),
        ValueRef::Blob(blob) => format!("X'{}'", hex(blob)),
        other => other.data_type().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(id: &str) -> Value {
        IdColumn(id).value()
    }

    #[test]
    fn canonical_uuids_are_stored_as_bytes_and_read_back() {
        let uuid = "0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5e";
        for id in [
            uuid.to_owned(),
            format!("session-message-{uuid}"),
            format!("é{uuid}"),
        ] {
            let Value::Blob(blob) = stored(&id) else {
                panic!("{id} is stored as text");
            };
            assert_eq!(blob.len(), id.len() - UUID_TEXT + UUID_BYTES);
            assert_eq!(read_id(ValueRef::Blob(&blob)).as_deref(), Ok(id.as_str()));
        }
    }

    #[test]
    fn other_spellings_stay_text() {
        for id in [
            "op-1",
            "0E5C7C34-5D1F-4A3B-9C2E-7F1A2B3C4D5E",
            "{0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5e}",
            "0e5c7c345d1f4a3b9c2e7f1a2b3c4d5e",
            "0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5",
            "0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5g",
            "0e5c7c3-45d1f-4a3b-9c2e-7f1a2b3c4d5e",
            "0e5c7c34-5d1f-4a3b-9c2e-7f1a2b3c4d5e ",
        ] {
            assert_eq!(stored(id), Value::Text(id.to_owned()), "{id}");
        }
    }

    #[test]
    fn values_that_no_id_becomes_are_errors() {
        assert_eq!(
            read_id(ValueRef::Blob(&[1, 2, 3])),
            Err("the ID is a 3-byte BLOB, shorter than a UUID".to_owned())
        );
        let mut bad_prefix = vec![0xff];
        bad_prefix.extend_from_slice(&[0; 16]);
        assert!(read_id(ValueRef::Blob(&bad_prefix)).is_err());
        assert_eq!(
            read_id(ValueRef::Integer(7)),
            Err("the ID is Integer".to_owned())
        );
        assert!(read_id(ValueRef::Null).is_err());
    }

    fn id_text() -> impl Strategy<Value = String> {
        // Short prefixes (some not ASCII) with and without a UUID-like tail, so both
        // branches and the near misses come up often.
        let tail = prop_oneof![
            Just(String::new()),
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-fA-F-]{36}",
        ];
        ("(\\PC|[a-z-]){0,12}", tail).prop_map(|(prefix, tail)| prefix + &tail)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

        // ST-01: what the submit tables store reads back as the exact ID, and two IDs
        // are stored equal exactly when they are equal, so keys keep their meaning.
        #[test]
        fn every_id_reads_back_and_equality_is_kept(a in id_text(), b in id_text()) {
            let (va, vb) = (stored(&a), stored(&b));
            prop_assert_eq!(read_id((&va).into()), Ok(a.clone()));
            prop_assert_eq!(va == vb, a == b);
        }
    }
}
