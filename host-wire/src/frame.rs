//! JSON-RPC 2.0 frames: a request decoded with the seed's limits, a response with its
//! result or its error, and the notifications the host sends (relay events and replay
//! chunks).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{WireError, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
use crate::method::{Call, METHODS};

/// The largest request frame the decoder reads, in bytes; a longer one is refused with
/// `FRAME_TOO_LARGE` before it is parsed (the seed's 8 MiB answer cap, applied to what
/// comes in).
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// The JSON-RPC request ID the client chose: a number or a string.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(untagged)]
pub enum RequestId {
    /// A number.
    Number(i64),
    /// A string.
    Text(String),
}

/// `"2.0"`, the only JSON-RPC version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(schema_with = "version_schema")]
pub struct Version2;

fn version_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "const": "2.0" })
}

impl Serialize for Version2 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("2.0")
    }
}

impl<'de> Deserialize<'de> for Version2 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Version2, D::Error> {
        let v = String::deserialize(d)?;
        if v == "2.0" {
            Ok(Version2)
        } else {
            Err(serde::de::Error::custom("jsonrpc must be \"2.0\""))
        }
    }
}

/// A request frame: `{"jsonrpc":"2.0","id":..,"method":..,"params":..}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Request {
    /// Always `"2.0"`.
    pub jsonrpc: Version2,
    /// Names the response.
    pub id: RequestId,
    /// The method and its params.
    #[serde(flatten)]
    pub call: Call,
}

impl Request {
    /// A request frame for `call`.
    pub fn new(id: RequestId, call: Call) -> Request {
        Request {
            jsonrpc: Version2,
            id,
            call,
        }
    }

    /// The frame's JSON.
    pub fn to_json(&self) -> String {
        // A request holds only strings, numbers and objects serde writes; writing it to a
        // string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A request the decoder refused, with the ID to answer when the frame had one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct Refusal {
    /// The request's ID, when it could be read (`null` in the answer otherwise).
    pub id: Option<RequestId>,
    /// Why.
    pub error: WireError,
}

impl Refusal {
    /// The error response that answers it.
    pub fn response(&self) -> Response {
        Response::error(self.id.clone(), self.error.clone())
    }
}

/// Decodes one request frame: at most [`MAX_FRAME_BYTES`], JSON, a JSON-RPC 2.0 request
/// object with an ID, a method of [`METHODS`], params that fit it and the seed's limits
/// ([`Call::check_limits`]). Unknown fields are ignored (the protocol only grows).
pub fn decode_request(text: &str) -> Result<Request, Refusal> {
    let refuse = |id: Option<RequestId>, error: WireError| Refusal { id, error };
    if text.len() > MAX_FRAME_BYTES {
        return Err(refuse(
            None,
            WireError::new(
                INVALID_REQUEST,
                "FRAME_TOO_LARGE",
                format!("a request frame may be at most {MAX_FRAME_BYTES} bytes"),
            ),
        ));
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        refuse(
            None,
            WireError::new(PARSE_ERROR, "PARSE_ERROR", format!("not JSON: {e}")),
        )
    })?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(refuse(
            None,
            invalid_request("a request must be a JSON object"),
        ));
    };
    let id = match object.get("id") {
        Some(id) => Some(
            RequestId::deserialize(id)
                .map_err(|_| refuse(None, invalid_request("id must be a number or a string")))?,
        ),
        None => None,
    };
    if object.get("jsonrpc").and_then(serde_json::Value::as_str) != Some("2.0") {
        return Err(refuse(id, invalid_request("jsonrpc must be \"2.0\"")));
    }
    let Some(id) = id else {
        return Err(refuse(None, invalid_request("a request must have an id")));
    };
    let method = match object.get("method").and_then(serde_json::Value::as_str) {
        Some(m) => m.to_owned(),
        None => return Err(refuse(Some(id), invalid_request("method must be a string"))),
    };
    if !METHODS.contains(&method.as_str()) {
        return Err(refuse(
            Some(id),
            WireError::new(
                METHOD_NOT_FOUND,
                "METHOD_NOT_FOUND",
                format!("no method {method:?}"),
            ),
        ));
    }
    // `run.list` takes no params; every other method needs an object.
    let params = object
        .remove("params")
        .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()));
    let call: Call = serde_json::from_value(serde_json::json!({
        "method": method,
        "params": params,
    }))
    .map_err(|e| refuse(Some(id.clone()), WireError::invalid_params(e.to_string())))?;
    call.check_limits()
        .map_err(|error| refuse(Some(id.clone()), error))?;
    Ok(Request::new(id, call))
}

fn invalid_request(message: &str) -> WireError {
    WireError::new(INVALID_REQUEST, "INVALID_REQUEST", message)
}

/// A response frame: the result, or the error, for one request ID.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Response {
    /// Always `"2.0"`.
    pub jsonrpc: Version2,
    /// The request's ID; `null` when the request's could not be read.
    pub id: Option<RequestId>,
    /// The answer: a result or an error.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A response's `result` or `error`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// What the method returned (its type is the method's: see [`crate::answer`]).
    Result(serde_json::Value),
    /// Why it failed.
    Error(WireError),
}

impl Response {
    /// A result for `id`.
    pub fn result(id: RequestId, result: serde_json::Value) -> Response {
        Response {
            jsonrpc: Version2,
            id: Some(id),
            outcome: Outcome::Result(result),
        }
    }

    /// An error for `id`.
    pub fn error(id: Option<RequestId>, error: WireError) -> Response {
        Response {
            jsonrpc: Version2,
            id,
            outcome: Outcome::Error(error),
        }
    }

    /// The frame's JSON.
    pub fn to_json(&self) -> String {
        // Values built by this crate: writing them to a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A notification frame the host sends: `{"jsonrpc":"2.0","method":..,"params":..}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Notification {
    /// Always `"2.0"`.
    pub jsonrpc: Version2,
    /// The event and its payload.
    #[serde(flatten)]
    pub event: crate::event::Event,
}

impl Notification {
    /// A notification carrying `event`.
    pub fn new(event: crate::event::Event) -> Notification {
        Notification {
            jsonrpc: Version2,
            event,
        }
    }

    /// The frame's JSON.
    pub fn to_json(&self) -> String {
        // Values built by this crate: writing them to a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}
