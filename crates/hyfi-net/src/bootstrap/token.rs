//! The job's secret and the randomness behind it: every connection of the
//! TCP transport proves it knows the token ([`crate::tcp::wire`]), so it
//! must be unpredictable (`/dev/urandom`), and it travels as the 32 hex
//! digits of `HYFI_TOKEN`. It is bootstrap's, not the transport's: hyfi's
//! launcher makes it and the job spec carries it, whoever proves it.

use std::io::Read;

/// A per-job secret that every connection must present.
pub type Token = [u8; 16];

/// A fresh random job token.
pub fn random_token() -> Token {
    let mut t = [0u8; 16];
    if !fill_random(&mut t) {
        t[..8].copy_from_slice(&fallback_random(0).to_le_bytes());
        t[8..].copy_from_slice(&fallback_random(1).to_le_bytes());
    }
    t
}

/// A random `u64` (a job id, say).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if fill_random(&mut b) {
        u64::from_le_bytes(b)
    } else {
        fallback_random(2)
    }
}

/// A token as the 32 lowercase hex digits `HYFI_TOKEN` carries.
pub fn token_hex(token: &Token) -> String {
    token.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token written as 32 hex digits (either case), or `None`.
pub fn parse_token(hex: &str) -> Option<Token> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let mut t = [0u8; 16];
    for (byte, pair) in t.iter_mut().zip(hex.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(t)
}

/// Fills `buf` from `/dev/urandom`; false if that cannot be read.
fn fill_random(buf: &mut [u8]) -> bool {
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
}

/// Time and pid mixed (visible to the tests of `bootstrap`): only for a system without `/dev/urandom`, where
/// unpredictability is out of reach anyway; `salt` tells calls apart.
pub(super) fn fallback_random(salt: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x =
        nanos ^ (u64::from(std::process::id()) << 32) ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser, so nearby inputs give unrelated outputs.
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
