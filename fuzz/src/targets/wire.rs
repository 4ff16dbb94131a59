//! Target `wire`: the request frame decoder of the host's wire (WI-01, WI-02).
//!
//! Checks:
//!
//! - decoding arbitrary text never panics, and every refusal carries a code this version
//!   lists and a response frame that is JSON;
//! - a decoded request passes the limits again (`into_client_request` takes it), and its
//!   own frame, written back, decodes to the same call (the decoder and the types agree).
//!
//! Script: the input is the frame's text (invalid UTF-8 is not a frame and is skipped).

use host_wire::{decode_request, ERROR_CODES};

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match decode_request(text) {
        Ok(request) => {
            let again = decode_request(&request.to_json())
                .expect("a decoded request's own frame decodes");
            assert_eq!(again, request, "the frame written back is the same request");
            request
                .call
                .into_client_request()
                .expect("a decoded request is a host request");
        }
        Err(refusal) => {
            assert!(
                ERROR_CODES.contains(&refusal.error.error_code()),
                "unlisted code {}",
                refusal.error.error_code()
            );
            let frame: serde_json::Value = serde_json::from_str(&refusal.response().to_json())
                .expect("the refusal's answer is JSON");
            assert_eq!(frame["jsonrpc"], "2.0");
        }
    }
}
