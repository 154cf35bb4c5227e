//! Hostile inputs to the pure core: any parameters in range, any stored
//! state the codec accepts, any clock reading. Nothing may panic (the
//! tests run with overflow checks on), and every state written back must
//! pass the codec's validation.

use proptest::prelude::*;
use rl_core::codec::{self, Decoded, PackedBucket, PackedWindow};
use rl_core::exact_log::{self, Log};
use rl_core::gcra::{self, GcraParams};
use rl_core::limits::*;
use rl_core::window::{self, WindowMode, WindowParams};
use rl_core::{BucketParams, BucketUpdate};

/// Values that stress arithmetic: the edges and a spread in between.
fn edgy(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(1), Just(2), Just(max.saturating_sub(1)), Just(max), 0..=max]
}

fn bucket_params() -> impl Strategy<Value = BucketParams> {
    (edgy(MAX_TOKENS), edgy(MAX_TOKENS), edgy(MAX_PERIOD_MS))
        .prop_filter_map("in range", |(c, r, p)| BucketParams::new(c, r, p).ok())
}

fn window_params() -> impl Strategy<Value = WindowParams> {
    (edgy(MAX_WINDOW_LIMIT), edgy(MAX_PERIOD_MS))
        .prop_filter_map("in range", |(l, w)| WindowParams::new(l, w, MAX_WINDOW_LIMIT).ok())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn buckets_survive_anything(
        buckets in proptest::collection::vec(bucket_params(), 1..4),
        raw in proptest::collection::vec(any::<[u8; 16]>(), 4),
        present in any::<[bool; 4]>(),
        now in edgy(MAX_TIME_MS),
        want in edgy(MAX_TOKENS),
        min_frac in 0u64..=100,
    ) {
        let states: Vec<_> = buckets.iter().enumerate().map(|(i, _)| {
            let mut blob = vec![b'B', 1];
            blob.extend_from_slice(&raw[i]);
            match codec::decode(&blob) {
                Ok(Decoded::Bucket(p)) if present[i] => Some(p.unpack()),
                _ => None,
            }
        }).collect();
        let want = want.max(1);
        let min = (want * min_frac / 100).max(1);
        for out in [
            rl_core::acquire(&buckets, &states, want, min, now),
            rl_core::force(&buckets, &states, want, now),
            rl_core::refund(&buckets, &states, want, now),
        ] {
            prop_assert!(out.decision.binding < buckets.len());
            for u in &out.updates {
                if let BucketUpdate::Store { state, expires_at_ms } = u {
                    prop_assert_eq!(state.validate(), Ok(()));
                    prop_assert!(*expires_at_ms > now && *expires_at_ms <= now + MAX_WAIT_MS);
                    prop_assert_eq!(PackedBucket::pack(state).unpack(), *state);
                }
            }
        }
    }

    #[test]
    fn windows_survive_anything(
        p in window_params(),
        raw in any::<[u8; 16]>(),
        now in edgy(MAX_TIME_MS),
        cost in edgy(MAX_WINDOW_LIMIT),
        sliding in any::<bool>(),
    ) {
        let mut blob = vec![b'W', 1];
        blob.extend_from_slice(&raw);
        let state = match codec::decode(&blob) {
            Ok(Decoded::Window(w)) => Some(w.unpack()),
            _ => None,
        };
        let mode = if sliding { WindowMode::Sliding } else { WindowMode::Fixed };
        let c = window::check(&p, mode, state.as_ref(), cost.max(1), now);
        if c.check.admits {
            prop_assert_eq!(c.after.validate(), Ok(()));
            prop_assert_eq!(PackedWindow::pack(&c.after).unpack(), c.after);
            prop_assert!(c.expires_at_ms > now);
        }
    }

    #[test]
    fn logs_survive_anything(
        limit in edgy(MAX_LOG_LIMIT),
        w in edgy(MAX_PERIOD_MS),
        entries in proptest::collection::vec((0..=MAX_TIME_MS, 1..=MAX_LOG_LIMIT), 0..50),
        now in edgy(MAX_TIME_MS),
        cost in edgy(MAX_LOG_LIMIT),
    ) {
        let Ok(p) = WindowParams::new(limit, w, MAX_LOG_LIMIT) else { return Ok(()) };
        let mut sorted = entries;
        sorted.sort();
        let mut l = Log::from_entries(sorted.into_iter().map(|(t, c)| exact_log::Entry::new(t, c))).unwrap();
        let c = exact_log::check(&p, Some(&l), cost.max(1), now);
        if c.check.admits {
            l.apply(&c.append).unwrap();
            let blob = codec::log_blob(&l);
            prop_assert!(matches!(codec::decode(&blob), Ok(Decoded::Log(_))));
        }
    }

    #[test]
    fn gcra_survives_anything(
        burst in prop_oneof![Just(0i64), 0..1_000_000i64, Just(i64::MAX / 2)],
        count in prop_oneof![Just(1i64), 1..1_000_000_000i64, Just(i64::MAX)],
        period in prop_oneof![Just(1i64), 1..1_000_000i64, Just(gcra::MAX_PERIOD_S)],
        tat in prop::option::of(any::<i64>()),
        now in 0..i64::MAX,
        quantity in prop_oneof![Just(0i64), 0..100i64, any::<i64>()],
    ) {
        if let Ok(p) = GcraParams::new(burst, count, period) {
            if let Ok(r) = gcra::throttle(&p, tat, now, quantity) {
                let _ = (gcra::cell_seconds(r.retry_after_ns), gcra::cell_seconds(r.reset_after_ns));
                if let Some(t) = r.new_tat_ns {
                    let _ = gcra::expires_at_ms(t);
                }
            }
        }
    }
}
