//! Policy constants (TL-13), in one place. Code refers to these names; no number below is
//! repeated elsewhere in the workspace.
//!
//! The values are the seed's "current manifest policy" table and the limits named beside
//! it. Host-side limits (reconcile caps, the response cap, dispatch caps) live here too
//! because clients and hosts must agree on them: each client wait is longer than the
//! host's cap for the same method, so a client hears the host's error before its own
//! timeout.

use crate::time::Millis;

/// Rows in the initial (latest) timeline window.
pub const INITIAL_PAGE_SIZE: usize = 12;
/// Rows a client asks for in an older page.
pub const OLDER_PAGE_SIZE: usize = 100;
/// The most rows the runtime serves in one page, whatever the request says.
pub const MAX_PAGE_SIZE: usize = 100;
/// Rows in every anchored window, whatever `pageSize` the request names (TL-12).
pub const ANCHORED_PAGE_SIZE: usize = 40;
/// The largest `pageSize` the RPC decoder accepts before the runtime clamps it to
/// [`MAX_PAGE_SIZE`].
pub const RPC_DECODER_MAX_PAGE_SIZE: usize = 640;

/// How long a client waits for a `run.chatLoad` or `run.chatLoadThread` answer: a
/// latest window, and an anchored load (the same methods with an anchor).
pub const INITIAL_LOAD_TIMEOUT: Millis = Millis::from_secs(115);
/// How long a client waits for an older page (`run.chatLoadPageBefore`,
/// `run.chatLoadThreadPageBefore`).
pub const PAGINATED_LOAD_TIMEOUT: Millis = Millis::from_secs(60);
/// How long a phone waits for an outbox command receipt.
pub const OUTBOX_ACK_TIMEOUT: Millis = Millis::from_secs(20);
/// How long a client that refused a live patch from a base it does not hold (an update
/// was lost on the way) waits for a whole snapshot before it loads the latest window
/// itself: one relay repair tick (5 s, which sends whole snapshots while a run is
/// active) and a second of margin. Past it nothing else would bring the client up to
/// the version it was offered (no run is active, or a window stream, which has no
/// repair tick).
pub const LIVE_GAP_WAIT: Millis = Millis::from_secs(6);

/// The host's handler deadline for `run.chatLoad` and `run.chatLoadThread`.
pub const LOAD_HANDLER_DEADLINE: Millis = Millis::from_secs(90);
/// The host's dispatch cap around [`LOAD_HANDLER_DEADLINE`] for `run.chatLoad` and
/// `run.chatLoadThread`.
pub const LOAD_DISPATCH_CAP: Millis = Millis::from_secs(95);
/// The host's dispatch cap of every other method, older pages included.
pub const DISPATCH_CAP: Millis = Millis::from_secs(45);

/// Retries of a failed initial load after the first request, for the same current target.
pub const INITIAL_LOAD_MAX_RETRIES: u32 = 3;
/// Delay before the first retry; each later retry doubles it.
pub const INITIAL_LOAD_RETRY_BASE: Millis = Millis(750);
/// The longest delay between two retries.
pub const INITIAL_LOAD_RETRY_MAX: Millis = Millis::from_secs(3);

/// The largest timeline response, in bytes of serialized JSON (8 MiB).
pub const RESPONSE_CAP_BYTES: usize = 8 * 1024 * 1024;
/// The `errorCode` of a response that would pass [`RESPONSE_CAP_BYTES`].
pub const SNAPSHOT_TOO_LARGE_CODE: &str = "TIMELINE_SNAPSHOT_TOO_LARGE";
/// Sessions one `run.chatReconcileSessions` call may name.
pub const RECONCILE_MAX_SESSIONS: usize = 16;
/// Outbox entries one session may have in a reconcile answer.
pub const RECONCILE_MAX_OUTBOX_ENTRIES: usize = 256;

/// The longest Claude cursor the host accepts, in characters.
pub const CLAUDE_CURSOR_MAX_CHARS: usize = 4096;
/// JavaScript's exact integer limit (2^53 - 1): revisions, epochs and every number a
/// client must read exactly stay at or below it.
pub const MAX_EXACT_INTEGER: u64 = 9_007_199_254_740_991;

/// The delay before retry number `retry` (1-based) of an initial load: 0.75 s, 1.5 s,
/// 3 s, capped at [`INITIAL_LOAD_RETRY_MAX`]. `None` once [`INITIAL_LOAD_MAX_RETRIES`] are
/// spent.
pub fn initial_load_retry_delay(retry: u32) -> Option<Millis> {
    if retry == 0 || retry > INITIAL_LOAD_MAX_RETRIES {
        return None;
    }
    let factor = 1u64 << (retry - 1).min(16);
    let delay = INITIAL_LOAD_RETRY_BASE.as_u64().saturating_mul(factor);
    Some(Millis(delay.min(INITIAL_LOAD_RETRY_MAX.as_u64())))
}

/// Why a requested `pageSize` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageSizeError {
    /// Zero rows, or more than the RPC decoder accepts.
    #[error("invalid params: pageSize must be between 1 and {max}")]
    OutOfRange {
        /// The largest value the decoder accepts.
        max: usize,
    },
}

/// The page size the runtime serves for a requested `pageSize`: the decoder accepts
/// 1..=640, the runtime then serves at most [`MAX_PAGE_SIZE`].
pub fn effective_page_size(requested: usize) -> Result<usize, PageSizeError> {
    if requested == 0 || requested > RPC_DECODER_MAX_PAGE_SIZE {
        return Err(PageSizeError::OutOfRange {
            max: RPC_DECODER_MAX_PAGE_SIZE,
        });
    }
    Ok(requested.min(MAX_PAGE_SIZE))
}

#[cfg(test)]
mod tests {
    use super::*;

    // TL-13
    #[test]
    fn retry_delays_double_up_to_the_cap_and_stop_after_three() {
        assert_eq!(initial_load_retry_delay(0), None);
        assert_eq!(initial_load_retry_delay(1), Some(Millis(750)));
        assert_eq!(initial_load_retry_delay(2), Some(Millis(1500)));
        assert_eq!(initial_load_retry_delay(3), Some(Millis(3000)));
        assert_eq!(initial_load_retry_delay(4), None);
    }

    // TL-13: the host gives up before the client does, for every method.
    #[test]
    fn client_waits_outlast_the_host_caps() {
        assert!(LOAD_HANDLER_DEADLINE < LOAD_DISPATCH_CAP);
        assert!(LOAD_DISPATCH_CAP < INITIAL_LOAD_TIMEOUT);
        assert!(DISPATCH_CAP < PAGINATED_LOAD_TIMEOUT);
    }

    // TL-13
    #[test]
    fn page_size_is_decoded_up_to_640_and_served_up_to_100() {
        assert_eq!(effective_page_size(1), Ok(1));
        assert_eq!(effective_page_size(100), Ok(100));
        assert_eq!(effective_page_size(101), Ok(100));
        assert_eq!(effective_page_size(640), Ok(100));
        assert!(effective_page_size(641).is_err());
        assert!(effective_page_size(0).is_err());
    }
}
