//! The stored forms of a limiter's state.
//!
//! In memory a bucket is 16 bytes (`PackedBucket`). Everywhere the state
//! leaves the process (RDB, AOF, the replicated `RL.SET`, `DEBUG DIGEST`),
//! it travels as a blob: a kind byte, a format version byte, then the packed
//! words in little-endian order. A later version adds a new version byte and
//! keeps decoding this one, so today's RDB and AOF files keep loading.

use crate::bucket::{BucketState, StateError};

/// Kind byte of a token bucket blob.
pub const KIND_BUCKET: u8 = b'B';
/// Current format version of each kind.
pub const VERSION_1: u8 = 1;

/// Length of a bucket blob: kind, version, two 64-bit words.
pub const BUCKET_BLOB_LEN: usize = 18;

/// A bucket in 16 bytes: 44 bits of time, 36 bits of fraction and 48 signed
/// bits of whole tokens (see `limits` for why each width is enough).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PackedBucket([u64; 2]);

const TIME_BITS: u32 = 44;
const FRACTION_BITS: u32 = 36;
const TOKEN_BITS: u32 = 48;
const _: () = assert!(TIME_BITS + FRACTION_BITS + TOKEN_BITS == 128);

impl PackedBucket {
    /// Packs a state that passed `BucketState::validate`.
    pub fn pack(s: &BucketState) -> Self {
        let mask = |bits: u32| (1u128 << bits) - 1;
        let v = (s.updated_ms as u128 & mask(TIME_BITS))
            | (s.fraction as u128 & mask(FRACTION_BITS)) << TIME_BITS
            | (s.tokens as u64 as u128 & mask(TOKEN_BITS)) << (TIME_BITS + FRACTION_BITS);
        Self([v as u64, (v >> 64) as u64])
    }

    pub fn unpack(&self) -> BucketState {
        let v = self.0[0] as u128 | (self.0[1] as u128) << 64;
        let field = |shift: u32, bits: u32| ((v >> shift) & ((1u128 << bits) - 1)) as u64;
        let raw_tokens = field(TIME_BITS + FRACTION_BITS, TOKEN_BITS);
        // Sign-extend the 48-bit field.
        let shift = 64 - TOKEN_BITS;
        BucketState {
            tokens: ((raw_tokens << shift) as i64) >> shift,
            fraction: field(TIME_BITS, FRACTION_BITS),
            updated_ms: field(0, TIME_BITS),
        }
    }

    pub fn to_blob(&self) -> [u8; BUCKET_BLOB_LEN] {
        let mut blob = [0u8; BUCKET_BLOB_LEN];
        blob[0] = KIND_BUCKET;
        blob[1] = VERSION_1;
        blob[2..10].copy_from_slice(&self.0[0].to_le_bytes());
        blob[10..18].copy_from_slice(&self.0[1].to_le_bytes());
        blob
    }
}

/// A decoded blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Bucket(PackedBucket),
}

/// Why a blob was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobError {
    /// Shorter than a kind and a version byte, or the wrong length for its kind.
    Length,
    /// A kind this build does not know.
    Kind,
    /// A version of the kind newer than this build.
    Version,
    /// Well-formed, but a field is out of range.
    State(StateError),
}

impl std::fmt::Display for BlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobError::Length => f.write_str("state blob has the wrong length"),
            BlobError::Kind => f.write_str("state blob is of an unknown kind"),
            BlobError::Version => f.write_str("state blob is of a newer format than this module"),
            BlobError::State(StateError::Tokens) => f.write_str("state blob tokens out of range"),
            BlobError::State(StateError::Fraction) => f.write_str("state blob fraction out of range"),
            BlobError::State(StateError::Time) => f.write_str("state blob time out of range"),
        }
    }
}

/// Decodes and validates a blob written by this or an earlier version.
pub fn decode(blob: &[u8]) -> Result<Stored, BlobError> {
    let [kind, version, payload @ ..] = blob else {
        return Err(BlobError::Length);
    };
    match (*kind, *version) {
        (KIND_BUCKET, VERSION_1) => {
            let words: &[u8; 16] = payload.try_into().map_err(|_| BlobError::Length)?;
            let lo = u64::from_le_bytes(words[..8].try_into().unwrap_or_default());
            let hi = u64::from_le_bytes(words[8..].try_into().unwrap_or_default());
            let packed = PackedBucket([lo, hi]);
            packed.unpack().validate().map_err(BlobError::State)?;
            Ok(Stored::Bucket(packed))
        }
        (KIND_BUCKET, _) => Err(BlobError::Version),
        _ => Err(BlobError::Kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_PERIOD_MS, MAX_TIME_MS, MAX_TOKENS};
    use proptest::prelude::*;

    #[test]
    fn packed_bucket_is_16_bytes() {
        assert_eq!(std::mem::size_of::<PackedBucket>(), 16);
    }

    #[test]
    fn extremes_round_trip() {
        for tokens in [BucketState::MIN_TOKENS, -1, 0, 1, MAX_TOKENS as i64] {
            for fraction in [0, 1, MAX_PERIOD_MS - 1] {
                for updated_ms in [0, 1, MAX_TIME_MS] {
                    let s = BucketState { tokens, fraction, updated_ms };
                    assert_eq!(PackedBucket::pack(&s).unpack(), s);
                }
            }
        }
    }

    #[test]
    fn blob_round_trip_and_errors() {
        let s = BucketState { tokens: -42, fraction: 17, updated_ms: 1_700_000_000_000 };
        let blob = PackedBucket::pack(&s).to_blob();
        assert_eq!(decode(&blob), Ok(Stored::Bucket(PackedBucket::pack(&s))));
        assert_eq!(decode(&blob[..17]), Err(BlobError::Length));
        assert_eq!(decode(b""), Err(BlobError::Length));
        assert_eq!(decode(b"B"), Err(BlobError::Length));
        let mut other = blob;
        other[0] = b'Z';
        assert_eq!(decode(&other), Err(BlobError::Kind));
        other = blob;
        other[1] = 2;
        assert_eq!(decode(&other), Err(BlobError::Version));
        // All-ones words decode to fields out of range.
        let mut junk = blob;
        junk[2..].fill(0xff);
        assert!(matches!(decode(&junk), Err(BlobError::State(_))));
    }

    /// The encoding of version 1 is frozen: files written today must load
    /// tomorrow. This pins the exact bytes.
    #[test]
    fn version_1_bytes_are_frozen() {
        let s = BucketState { tokens: 5, fraction: 3, updated_ms: 1_000 };
        let blob = PackedBucket::pack(&s).to_blob();
        assert_eq!(
            blob,
            [b'B', 1, 0xe8, 0x03, 0, 0, 0, 0x30, 0, 0, 0, 0, 0x05, 0, 0, 0, 0, 0]
        );
    }

    proptest! {
        #[test]
        fn any_valid_state_round_trips(
            tokens in BucketState::MIN_TOKENS..=MAX_TOKENS as i64,
            fraction in 0..MAX_PERIOD_MS,
            updated_ms in 0..=MAX_TIME_MS,
        ) {
            let s = BucketState { tokens, fraction, updated_ms };
            let blob = PackedBucket::pack(&s).to_blob();
            prop_assert_eq!(decode(&blob), Ok(Stored::Bucket(PackedBucket::pack(&s))));
            prop_assert_eq!(PackedBucket::pack(&s).unpack(), s);
        }

        #[test]
        fn decode_never_panics(blob in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode(&blob);
        }
    }
}
