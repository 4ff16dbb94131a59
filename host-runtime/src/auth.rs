//! Who may connect: pairing codes the host shows, exchanged for device tokens kept only
//! as hashes, and a limit on failed attempts.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a pairing code may be used.
pub const PAIRING_CODE_LIFETIME: Duration = Duration::from_secs(300);
/// Failed attempts (a bad token, a bad pairing code) one address may make in
/// [`FAILURE_WINDOW`] before it is refused without a check.
pub const MAX_FAILURES: usize = 5;
/// The window of [`MAX_FAILURES`].
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Pairing codes waiting at most; the oldest goes first.
const MAX_CODES: usize = 16;
/// Addresses whose failures are remembered at most.
const MAX_ADDRESSES: usize = 4096;

/// The alphabet of pairing codes: no 0/O, 1/I/L, so a person reads it right.
const CODE_ALPHABET: &[u8] = b"23456789ABCDEFGHJKMNPQRSTUVWXYZ";
/// Characters of a pairing code.
const CODE_LEN: usize = 8;

/// A paired device, as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its ID (random, not secret).
    pub device_id: String,
    /// The name it gave when it paired.
    pub name: String,
    /// When it paired, in wall-clock milliseconds.
    pub paired_at_ms: u64,
    /// The SHA-256 of its token, hex: the token itself is never kept.
    pub token_sha256: String,
}

/// The devices a host knows. Serialize it to keep pairings across restarts: it holds
/// only hashes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Devices {
    devices: BTreeMap<String, Device>,
}

impl Devices {
    /// Every device.
    pub fn list(&self) -> Vec<Device> {
        self.devices.values().cloned().collect()
    }

    /// Forgets a device: its token is refused from now on. False when unknown.
    pub fn revoke(&mut self, device_id: &str) -> bool {
        self.devices.remove(device_id).is_some()
    }

    /// The device whose token this is.
    pub fn authorize(&self, token: &str) -> Option<&Device> {
        let hash = sha256_hex(token.as_bytes());
        self.devices.values().find(|d| d.token_sha256 == hash)
    }

    fn add(&mut self, name: &str, now_ms: u64) -> Result<(Device, String), getrandom::Error> {
        let token = hex(&random::<32>()?);
        let device = Device {
            device_id: format!("device-{}", hex(&random::<8>()?)),
            name: name.to_owned(),
            paired_at_ms: now_ms,
            token_sha256: sha256_hex(token.as_bytes()),
        };
        self.devices
            .insert(device.device_id.clone(), device.clone());
        Ok((device, token))
    }
}

/// Pairing codes waiting to be used, and failed attempts by address.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    codes: VecDeque<(String, Instant)>,
    failures: HashMap<IpAddr, VecDeque<Instant>>,
}

/// Why a pairing or a token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Wrong, used, expired or revoked.
    Bad,
    /// Too many failures from this address lately.
    Limited,
}

impl Gate {
    /// A new single-use code, valid for [`PAIRING_CODE_LIFETIME`].
    pub(crate) fn new_code(&mut self, now: Instant) -> Result<String, getrandom::Error> {
        let bytes = random::<CODE_LEN>()?;
        let code: String = bytes
            .iter()
            .map(|b| char::from(CODE_ALPHABET[usize::from(*b) % CODE_ALPHABET.len()]))
            .collect();
        self.expire(now);
        if self.codes.len() >= MAX_CODES {
            self.codes.pop_front();
        }
        self.codes.push_back((code.clone(), now));
        Ok(code)
    }

    /// Refuses an address with too many recent failures.
    pub(crate) fn check(&mut self, from: IpAddr, now: Instant) -> Result<(), Refused> {
        let recent = self.failures.entry(from).or_default();
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= FAILURE_WINDOW)
        {
            recent.pop_front();
        }
        if recent.len() >= MAX_FAILURES {
            return Err(Refused::Limited);
        }
        Ok(())
    }

    /// Counts a failure of `from`.
    pub(crate) fn failed(&mut self, from: IpAddr, now: Instant) {
        if self.failures.len() >= MAX_ADDRESSES && !self.failures.contains_key(&from) {
            // Forget the addresses with nothing recent first; failing that, one at
            // random order of the map (bounded memory wins over a perfect count).
            self.failures.retain(|_, v| {
                v.back()
                    .is_some_and(|t| now.duration_since(*t) < FAILURE_WINDOW)
            });
            if self.failures.len() >= MAX_ADDRESSES {
                if let Some(k) = self.failures.keys().next().copied() {
                    self.failures.remove(&k);
                }
            }
        }
        let recent = self.failures.entry(from).or_default();
        recent.push_back(now);
        while recent.len() > MAX_FAILURES {
            recent.pop_front();
        }
    }

    /// Uses `code` (once) to pair a device named `name`: its token, shown once.
    pub(crate) fn pair(
        &mut self,
        devices: &mut Devices,
        code: &str,
        name: &str,
        from: IpAddr,
        now: Instant,
        now_ms: u64,
    ) -> Result<Result<(Device, String), getrandom::Error>, Refused> {
        self.check(from, now)?;
        self.expire(now);
        let Some(i) = self.codes.iter().position(|(c, _)| c == code) else {
            self.failed(from, now);
            return Err(Refused::Bad);
        };
        self.codes.remove(i);
        Ok(devices.add(name, now_ms))
    }

    fn expire(&mut self, now: Instant) {
        self.codes
            .retain(|(_, at)| now.duration_since(*at) < PAIRING_CODE_LIFETIME);
    }
}

fn random<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip() -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }

    #[test]
    fn a_code_pairs_once_and_the_token_is_kept_only_as_its_hash() {
        let (mut gate, mut devices) = (Gate::default(), Devices::default());
        let t0 = Instant::now();
        let code = gate.new_code(t0).unwrap();
        assert_eq!(code.len(), CODE_LEN);
        let (device, token) = gate
            .pair(&mut devices, &code, "phone", ip(), t0, 1)
            .unwrap()
            .unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(devices.authorize(&token), Some(&device));
        let saved = serde_json::to_string(&devices).unwrap();
        assert!(!saved.contains(&token), "only the hash is kept");
        // Single use.
        assert_eq!(
            gate.pair(&mut devices, &code, "again", ip(), t0, 2),
            Err(Refused::Bad)
        );
        // Revoked: refused.
        assert!(devices.revoke(&device.device_id));
        assert_eq!(devices.authorize(&token), None);
    }

    #[test]
    fn a_code_expires_after_its_lifetime() {
        let (mut gate, mut devices) = (Gate::default(), Devices::default());
        let t0 = Instant::now();
        let code = gate.new_code(t0).unwrap();
        let late = t0 + PAIRING_CODE_LIFETIME;
        assert_eq!(
            gate.pair(&mut devices, &code, "phone", ip(), late, 1),
            Err(Refused::Bad)
        );
        let code = gate.new_code(t0).unwrap();
        let just = t0 + PAIRING_CODE_LIFETIME - Duration::from_millis(1);
        assert!(gate
            .pair(&mut devices, &code, "phone", ip(), just, 1)
            .is_ok());
    }

    #[test]
    fn failures_are_limited_per_address_and_forgotten_after_the_window() {
        let (mut gate, mut devices) = (Gate::default(), Devices::default());
        let t0 = Instant::now();
        let code = gate.new_code(t0).unwrap();
        for _ in 0..MAX_FAILURES {
            assert_eq!(
                gate.pair(&mut devices, "WRONG", "x", ip(), t0, 1),
                Err(Refused::Bad)
            );
        }
        // At the limit even the right code is refused unread.
        assert_eq!(
            gate.pair(&mut devices, &code, "x", ip(), t0, 1),
            Err(Refused::Limited)
        );
        // Another address is not limited.
        assert!(gate.check(IpAddr::from([10, 0, 0, 1]), t0).is_ok());
        // After the window the code works (it is still within its lifetime).
        let later = t0 + FAILURE_WINDOW;
        assert!(gate.pair(&mut devices, &code, "x", ip(), later, 1).is_ok());
    }
}
