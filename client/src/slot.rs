//! The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384.
//!
//! The client routes each call to its slot's primary itself (redis-rs would
//! route an unknown command by its first argument, `numkeys`) and keys its
//! per-shard circuit breakers on the slot.

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The part of a key that is hashed: the text between the first `{` and the
/// next `}`, when that is not empty; else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The slot of `key`.
pub fn slot_of(key: &str) -> u16 {
    crc16(hash_tag(key.as_bytes())) % SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_cluster_keyslot() {
        // Values from CLUSTER KEYSLOT on redis-server 7.0.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("somekey"), 11058);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("rl:{u}:a"), slot_of("u"));
    }

    #[test]
    fn empty_or_unclosed_tags_hash_the_whole_key() {
        assert_eq!(hash_tag(b"a{}b"), b"a{}b");
        assert_eq!(hash_tag(b"a{b"), b"a{b");
        assert_eq!(hash_tag(b"{a}{b}"), b"a");
        assert_eq!(hash_tag(b"x{a{b}c"), b"a{b");
    }
}
