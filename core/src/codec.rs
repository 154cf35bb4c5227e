//! The stored forms of a limiter's state.
//!
//! In memory a bucket is 16 bytes (`PackedBucket`). Everywhere the state
//! leaves the process (RDB, AOF, the replicated `RL.SET`, `DEBUG DIGEST`),
//! it travels as a blob: a kind byte, a format version byte, then the packed
//! words in little-endian order. A later version adds a new version byte and
//! keeps decoding this one, so today's RDB and AOF files keep loading.

use crate::bucket::{BucketState, StateError};
use crate::exact_log::{Entry, Log, LogError};
use crate::inflight::{Slot, Slots, SlotsError, MAX_ID_LEN, MAX_INFLIGHT_LIMIT};
use crate::window::{WindowState, WindowStateError};

/// `v` in decimal, written into `buf` (the longest u64 is 20 digits): the
/// numbers of replicated commands and of HTTP headers, without a formatter.
pub fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// Kind byte of a token bucket blob.
pub const KIND_BUCKET: u8 = b'B';
/// Kind byte of a SLIDING/FIXED window blob.
pub const KIND_WINDOW: u8 = b'W';
/// Kind byte of an EXACT log blob.
pub const KIND_LOG: u8 = b'L';
/// Kind byte of an in-flight set blob.
pub const KIND_INFLIGHT: u8 = b'I';
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
        words_blob(KIND_BUCKET, self.0)
    }
}

/// A window in 16 bytes: 44 bits of window start, 42 bits for each count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PackedWindow([u64; 2]);

const COUNT_BITS: u32 = 42;
const _: () = assert!(TIME_BITS + 2 * COUNT_BITS == 128);

impl PackedWindow {
    /// Packs a state that passed `WindowState::validate`.
    pub fn pack(s: &WindowState) -> Self {
        let mask = |bits: u32| (1u128 << bits) - 1;
        let v = (s.start_ms as u128 & mask(TIME_BITS))
            | (s.previous as u128 & mask(COUNT_BITS)) << TIME_BITS
            | (s.current as u128 & mask(COUNT_BITS)) << (TIME_BITS + COUNT_BITS);
        Self([v as u64, (v >> 64) as u64])
    }

    pub fn unpack(&self) -> WindowState {
        let v = self.0[0] as u128 | (self.0[1] as u128) << 64;
        let field = |shift: u32, bits: u32| ((v >> shift) & ((1u128 << bits) - 1)) as u64;
        WindowState {
            start_ms: field(0, TIME_BITS),
            previous: field(TIME_BITS, COUNT_BITS),
            current: field(TIME_BITS + COUNT_BITS, COUNT_BITS),
        }
    }

    pub fn to_blob(&self) -> [u8; BUCKET_BLOB_LEN] {
        words_blob(KIND_WINDOW, self.0)
    }
}

/// The blob of an EXACT log: kind, version, then each entry as 8 bytes.
pub fn log_blob(log: &Log) -> Vec<u8> {
    let mut blob = Vec::with_capacity(2 + 8 * log.len());
    blob.extend_from_slice(&[KIND_LOG, VERSION_1]);
    for e in log.entries() {
        blob.extend_from_slice(&e.raw().to_le_bytes());
    }
    blob
}

/// The blob of an in-flight set: kind, version, then each slot as its id's
/// length (1 byte), the id, the deadline (8 bytes) and the count (4 bytes).
pub fn inflight_blob(set: &Slots) -> Vec<u8> {
    let mut blob = Vec::with_capacity(2 + set.slots().iter().map(|s| 13 + s.id.len()).sum::<usize>());
    blob.extend_from_slice(&[KIND_INFLIGHT, VERSION_1]);
    for s in set.slots() {
        blob.push(s.id.len() as u8);
        blob.extend_from_slice(&s.id);
        blob.extend_from_slice(&s.deadline_ms.to_le_bytes());
        blob.extend_from_slice(&(s.count as u32).to_le_bytes());
    }
    blob
}

fn inflight_slots(mut payload: &[u8]) -> Result<Slots, BlobError> {
    let mut slots = Vec::new();
    while let [len, rest @ ..] = payload {
        let len = *len as usize;
        if slots.len() as u64 >= MAX_INFLIGHT_LIMIT {
            return Err(BlobError::Inflight(SlotsError::Length));
        }
        if len == 0 || len > MAX_ID_LEN || rest.len() < len + 12 {
            return Err(BlobError::Length);
        }
        let (id, rest) = rest.split_at(len);
        let (deadline, rest) = rest.split_at(8);
        let (count, rest) = rest.split_at(4);
        slots.push(Slot {
            id: id.into(),
            deadline_ms: u64::from_le_bytes(deadline.try_into().unwrap_or_default()),
            count: u32::from_le_bytes(count.try_into().unwrap_or_default()) as u64,
        });
        payload = rest;
    }
    Slots::from_slots(slots).map_err(BlobError::Inflight)
}

fn words_blob(kind: u8, words: [u64; 2]) -> [u8; BUCKET_BLOB_LEN] {
    let mut blob = [0u8; BUCKET_BLOB_LEN];
    blob[0] = kind;
    blob[1] = VERSION_1;
    blob[2..10].copy_from_slice(&words[0].to_le_bytes());
    blob[10..18].copy_from_slice(&words[1].to_le_bytes());
    blob
}

/// A decoded blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    Bucket(PackedBucket),
    Window(PackedWindow),
    Log(Log),
    Inflight(Slots),
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
    WindowState(WindowStateError),
    Log(LogError),
    Inflight(SlotsError),
}

impl std::fmt::Display for BlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobError::Length => f.write_str("state blob has the wrong length"),
            BlobError::Kind => f.write_str("state blob is of an unknown kind"),
            BlobError::Version => f.write_str("state blob is of a newer format than this module"),
            BlobError::State(StateError::Tokens) => f.write_str("state blob tokens out of range"),
            BlobError::State(StateError::Fraction) => f.write_str("state blob fraction out of range"),
            BlobError::State(StateError::Time) | BlobError::WindowState(WindowStateError::Time) => {
                f.write_str("state blob time out of range")
            }
            BlobError::WindowState(WindowStateError::Count) => f.write_str("state blob count out of range"),
            BlobError::Log(LogError::Length) => f.write_str("state blob log is longer than any log may be"),
            BlobError::Log(LogError::Entry) => f.write_str("state blob log entry out of range"),
            BlobError::Log(LogError::Order) => f.write_str("state blob log entries out of time order"),
            BlobError::Log(LogError::Empty) => f.write_str(
                "state blob log has no entry (an EXACT key always holds one, so the module never writes it)",
            ),
            BlobError::Log(LogError::Ahead) => {
                f.write_str("state blob log entry more than a day ahead of this server's clock")
            }
            BlobError::WindowState(WindowStateError::Ahead) => {
                f.write_str("state blob window start more than a day ahead of this server's clock")
            }
            BlobError::Inflight(e) => write!(f, "state blob: {e}"),
        }
    }
}

/// Decodes a blob read at `now_ms` on the server's clock (RDB load,
/// `RESTORE`, `RL.SET`): [`decode`], and nothing the module never writes,
/// however well formed: an EXACT log or in-flight set with nothing in it
/// (the module deletes such a key), a window or log time more than a day
/// ahead of the clock, a slot deadline past the longest timeout from it. A
/// bucket stamped ahead is taken: its next call re-stamps it at now.
pub fn decode_at(blob: &[u8], now_ms: u64) -> Result<Decoded, BlobError> {
    let decoded = decode(blob)?;
    match &decoded {
        Decoded::Bucket(_) => {}
        Decoded::Window(w) => w.unpack().fits_clock(now_ms).map_err(BlobError::WindowState)?,
        Decoded::Log(l) => l.fits_clock(now_ms).map_err(BlobError::Log)?,
        Decoded::Inflight(s) => s.fits_clock(now_ms).map_err(BlobError::Inflight)?,
    }
    Ok(decoded)
}

/// Decodes and validates a blob written by this or an earlier version.
pub fn decode(blob: &[u8]) -> Result<Decoded, BlobError> {
    let [kind, version, payload @ ..] = blob else {
        return Err(BlobError::Length);
    };
    let words = || -> Result<[u64; 2], BlobError> {
        let bytes: &[u8; 16] = payload.try_into().map_err(|_| BlobError::Length)?;
        let (lo, hi) = bytes.split_at(8);
        Ok([
            u64::from_le_bytes(lo.try_into().unwrap_or_default()),
            u64::from_le_bytes(hi.try_into().unwrap_or_default()),
        ])
    };
    match (*kind, *version) {
        (KIND_BUCKET, VERSION_1) => {
            let packed = PackedBucket(words()?);
            packed.unpack().validate().map_err(BlobError::State)?;
            Ok(Decoded::Bucket(packed))
        }
        (KIND_WINDOW, VERSION_1) => {
            let packed = PackedWindow(words()?);
            packed.unpack().validate().map_err(BlobError::WindowState)?;
            Ok(Decoded::Window(packed))
        }
        (KIND_LOG, VERSION_1) => {
            if payload.len() % 8 != 0 {
                return Err(BlobError::Length);
            }
            if (payload.len() / 8) as u64 > crate::limits::MAX_LOG_LIMIT {
                return Err(BlobError::Log(LogError::Length));
            }
            let entries =
                payload.chunks_exact(8).map(|c| Entry::from_raw(u64::from_le_bytes(c.try_into().unwrap_or_default())));
            Ok(Decoded::Log(Log::from_entries(entries).map_err(BlobError::Log)?))
        }
        (KIND_INFLIGHT, VERSION_1) => Ok(Decoded::Inflight(inflight_slots(payload)?)),
        (KIND_BUCKET | KIND_WINDOW | KIND_LOG | KIND_INFLIGHT, _) => Err(BlobError::Version),
        _ => Err(BlobError::Kind),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_are_written_as_digits() {
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            assert_eq!(super::decimal(n, &mut [0; 20]), n.to_string().as_bytes());
        }
    }

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
        assert_eq!(decode(&blob), Ok(Decoded::Bucket(PackedBucket::pack(&s))));
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
        assert_eq!(blob, [b'B', 1, 0xe8, 0x03, 0, 0, 0, 0x30, 0, 0, 0, 0, 0x05, 0, 0, 0, 0, 0]);
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
            prop_assert_eq!(decode(&blob), Ok(Decoded::Bucket(PackedBucket::pack(&s))));
            prop_assert_eq!(PackedBucket::pack(&s).unpack(), s);
        }

        #[test]
        fn decode_never_panics(blob in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode(&blob);
            let mut inflight = vec![KIND_INFLIGHT, VERSION_1];
            inflight.extend_from_slice(&blob);
            let _ = decode(&inflight);
        }
    }

    #[test]
    fn window_and_log_blobs_round_trip() {
        use crate::limits::MAX_WINDOW_LIMIT;
        let w = WindowState { start_ms: MAX_TIME_MS, previous: MAX_WINDOW_LIMIT, current: 7 };
        let packed = PackedWindow::pack(&w);
        assert_eq!(packed.unpack(), w);
        assert_eq!(decode(&packed.to_blob()), Ok(Decoded::Window(packed)));
        let log = Log::from_entries([Entry::new(5, 1), Entry::new(9, 3)]).unwrap();
        let blob = log_blob(&log);
        assert_eq!(blob.len(), 2 + 16);
        assert_eq!(decode(&blob), Ok(Decoded::Log(log)));
        assert_eq!(decode(&blob[..5]), Err(BlobError::Length));
        let mut bad = blob.clone();
        bad[2..10].copy_from_slice(&Entry::new(99, 1).raw().to_le_bytes());
        assert_eq!(decode(&bad), Err(BlobError::Log(LogError::Order)));
        let mut too_big = PackedWindow::pack(&w).to_blob();
        too_big[10..].fill(0xff);
        assert_eq!(decode(&too_big), Err(BlobError::WindowState(WindowStateError::Count)));
    }

    #[test]
    fn inflight_blobs_round_trip_and_are_checked() {
        let slot = |id: &[u8], d: u64, n: u64| Slot { id: id.into(), deadline_ms: d, count: n };
        let set = Slots::from_slots(vec![slot(b"req-1", 1_000, 1), slot(&[0xff; MAX_ID_LEN], MAX_TIME_MS, 7)]).unwrap();
        let blob = inflight_blob(&set);
        assert_eq!(blob.len(), 2 + (1 + 5 + 12) + (1 + MAX_ID_LEN + 12));
        assert_eq!(decode(&blob), Ok(Decoded::Inflight(set)));
        assert_eq!(decode(&[KIND_INFLIGHT, VERSION_1]), Ok(Decoded::Inflight(Slots::default())));
        assert_eq!(decode(&blob[..blob.len() - 1]), Err(BlobError::Length));
        let mut zero_len = blob.clone();
        zero_len[2] = 0;
        assert_eq!(decode(&zero_len), Err(BlobError::Length));
        let twice = [&blob[..], &blob[2..20]].concat();
        assert_eq!(decode(&twice), Err(BlobError::Inflight(SlotsError::Repeated)));
        let mut no_count = blob.clone();
        no_count[16..20].fill(0);
        assert_eq!(decode(&no_count), Err(BlobError::Inflight(SlotsError::Slot)));
        // Version 1, pinned.
        assert_eq!(
            inflight_blob(&Slots::from_slots(vec![slot(b"a", 258, 3)]).unwrap()),
            [b'I', 1, 1, b'a', 2, 1, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]
        );
    }

    #[test]
    fn blobs_read_at_a_time_refuse_what_no_server_with_that_clock_wrote() {
        use crate::limits::MAX_CLOCK_AHEAD_MS as DAY;
        let now = 1_700_000_000_000;
        let slots = |deadline_ms| {
            inflight_blob(&Slots::from_slots(vec![Slot { id: (*b"a").into(), deadline_ms, count: 1 }]).unwrap())
        };
        let longest = now + MAX_PERIOD_MS + DAY;
        assert!(decode_at(&slots(longest), now).is_ok());
        assert_eq!(decode_at(&slots(longest + 1), now), Err(BlobError::Inflight(SlotsError::Deadline)));
        assert_eq!(decode_at(&slots(MAX_TIME_MS), now), Err(BlobError::Inflight(SlotsError::Deadline)));
        assert_eq!(decode_at(&[KIND_INFLIGHT, VERSION_1], now), Err(BlobError::Inflight(SlotsError::Empty)));
        let window = |start_ms| PackedWindow::pack(&WindowState { start_ms, previous: 1, current: 2 }).to_blob();
        assert!(decode_at(&window(now + DAY), now).is_ok());
        assert_eq!(decode_at(&window(now + DAY + 1), now), Err(BlobError::WindowState(WindowStateError::Ahead)));
        let log = |at: &[u64]| log_blob(&Log::from_entries(at.iter().map(|&t| Entry::new(t, 1))).unwrap());
        assert!(decode_at(&log(&[now, now + DAY]), now).is_ok());
        assert_eq!(decode_at(&log(&[now, now + DAY + 1]), now), Err(BlobError::Log(LogError::Ahead)));
        assert_eq!(decode_at(&log(&[]), now), Err(BlobError::Log(LogError::Empty)));
        // A bucket stamped ahead is re-stamped by its next call: taken.
        let bucket = PackedBucket::pack(&BucketState { tokens: 0, fraction: 0, updated_ms: MAX_TIME_MS }).to_blob();
        assert!(decode_at(&bucket, now).is_ok());
        // What decode alone takes, the format, is unchanged.
        assert!(decode(&slots(MAX_TIME_MS)).is_ok() && decode(&log(&[])).is_ok());
    }
}
