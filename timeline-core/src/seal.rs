//! The host key that makes cursors and anchor tokens tamper-evident.
//!
//! The seed says a token "that the desktop did not write" must fail. Decoding alone can
//! only guess at that; a keyed MAC (HMAC-SHA-256 over the payload, with a domain label per
//! token kind) makes it a check. The host draws the key once (from its own randomness) and
//! keeps it; a token written under another key fails like a forged one.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A 32-byte secret of the host. `Debug` never prints the bytes.
#[derive(Clone)]
pub struct HostKey([u8; 32]);

impl HostKey {
    /// A key from bytes the host generated.
    pub fn from_bytes(bytes: [u8; 32]) -> HostKey {
        HostKey(bytes)
    }

    fn mac(&self, domain: &str, payload: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail; fall back to an empty-key
        // MAC rather than panic if the crate ever changed that.
        let mut mac = HmacSha256::new_from_slice(&self.0)
            .unwrap_or_else(|_| HmacSha256::new(&Default::default()));
        mac.update(&(domain.len() as u64).to_be_bytes());
        mac.update(domain.as_bytes());
        mac.update(payload);
        mac
    }

    /// `base64url(payload) + "." + base64url(mac)`.
    pub(crate) fn seal(&self, domain: &str, payload: &[u8]) -> String {
        let tag = self.mac(domain, payload).finalize().into_bytes();
        let mut out = URL_SAFE_NO_PAD.encode(payload);
        out.push('.');
        out.push_str(&URL_SAFE_NO_PAD.encode(tag));
        out
    }

    /// The payload of a sealed text, or `None` when it is malformed or was not sealed
    /// under this key and domain.
    pub(crate) fn open(&self, domain: &str, sealed: &str) -> Option<Vec<u8>> {
        let (body, tag) = sealed.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(body).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(domain, &payload).verify_slice(&tag).ok()?;
        Some(payload)
    }

    /// Hex MAC over `payload` (for formats whose envelope is itself JSON).
    pub(crate) fn mac_hex(&self, domain: &str, payload: &[u8]) -> String {
        hex(&self.mac(domain, payload).finalize().into_bytes())
    }

    /// Checks a hex MAC from [`HostKey::mac_hex`] in constant time.
    pub(crate) fn verify_hex(&self, domain: &str, payload: &[u8], tag_hex: &str) -> bool {
        match unhex(tag_hex) {
            Some(tag) => self.mac(domain, payload).verify_slice(&tag).is_ok(),
            None => false,
        }
    }
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostKey(..)")
    }
}

/// Lower-case hex of `bytes`, the form every digest of the workspace takes on the wire.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The bytes behind text [`hex`] wrote: `None` unless `s` is lower-case hex of whole
/// bytes, so `hex(&unhex(s)?) == s` always holds.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let text = s.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_text_opens_only_under_its_key_and_domain() {
        let k = HostKey::from_bytes([7; 32]);
        let other = HostKey::from_bytes([8; 32]);
        let s = k.seal("a", b"payload");
        assert_eq!(k.open("a", &s).as_deref(), Some(&b"payload"[..]));
        assert_eq!(k.open("b", &s), None);
        assert_eq!(other.open("a", &s), None);
        let mut forged = s.clone();
        forged.replace_range(0..1, if s.starts_with('A') { "B" } else { "A" });
        assert_eq!(k.open("a", &forged), None);
        assert!(k.verify_hex("a", b"x", &k.mac_hex("a", b"x")));
        assert!(!k.verify_hex("a", b"y", &k.mac_hex("a", b"x")));
        assert!(!k.verify_hex("a", b"x", "zz"));
    }

    #[test]
    fn unhex_reads_exactly_what_hex_writes() {
        let bytes = [0x00, 0x0a, 0xff, 0x7e];
        assert_eq!(unhex(&hex(&bytes)).as_deref(), Some(&bytes[..]));
        assert_eq!(unhex("").as_deref(), Some(&[][..]));
        // Upper case, a sign, an odd length, a non-digit and a multi-byte character are
        // not text hex() writes.
        for text in ["0A", "+a", "0", "zz", "\u{e9}1"] {
            assert_eq!(unhex(text), None, "{text}");
        }
        let tag = HostKey::from_bytes([7; 32]).mac_hex("a", b"x");
        assert!(!HostKey::from_bytes([7; 32]).verify_hex("a", b"x", &tag.to_uppercase()));
    }
}
