//! Token bucket commands: RL.TAKE (with FORCE), RL.PEEK, RL.LEASE and
//! RL.REFUND. Each refills, checks and changes several buckets in one step
//! on the server's clock, or (PEEK) only checks.

use redis_module::raw::RedisModuleString;
use rl_core::acquire::INLINE;
use rl_core::codec::PackedBucket;
use rl_core::{BucketParams, BucketState, Reply, Outcome, Update};
use smallvec::SmallVec;

use super::{arg_bytes, load, replicate, reply_decision, Effect};
use crate::args::{self, FIRST_KEY};
use crate::clock;
use crate::ffi::Ctx;
use crate::stats::Verdict;

type Op<'a> = &'a dyn Fn(&[BucketParams], &[Option<BucketState>], u64) -> Outcome;

pub fn take(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let a = args::parse_take(&arg_bytes(argv), true).map_err(|e| e.0)?;
    let op: Op = if a.force {
        &|b, s, now| rl_core::force(b, s, a.cost, now)
    } else {
        &|b, s, now| rl_core::acquire(b, s, a.cost, a.cost, now)
    };
    decide(ctx, argv, a.numkeys, &a.buckets, true, op, allowed)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let a = args::parse_take(&arg_bytes(argv), false).map_err(|e| e.0)?;
    decide(ctx, argv, a.numkeys, &a.buckets, false, &|b, s, now| rl_core::acquire(b, s, a.cost, a.cost, now), allowed)
}

pub fn lease(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let a = args::parse_lease(&arg_bytes(argv)).map_err(|e| e.0)?;
    decide(ctx, argv, a.numkeys, &a.buckets, true, &|b, s, now| rl_core::acquire(b, s, a.want, a.min, now), |d| {
        d.granted as i64
    })
}

pub fn refund(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let a = args::parse_refund(&arg_bytes(argv)).map_err(|e| e.0)?;
    decide(ctx, argv, a.numkeys, &a.buckets, true, &|b, s, now| rl_core::refund(b, s, a.tokens, now), allowed)
}

fn allowed(d: &Reply) -> i64 {
    d.allowed() as i64
}

/// Loads the buckets, runs `op` on them, writes and replicates what it
/// changed (unless `write` is false or nothing was granted), and replies.
fn decide(
    ctx: Ctx,
    argv: &[*mut RedisModuleString],
    numkeys: usize,
    buckets: &[BucketParams],
    write: bool,
    op: Op,
    first: fn(&Reply) -> i64,
) -> Result<Verdict, String> {
    let now = clock::now_ms()?;
    let names = &argv[FIRST_KEY..FIRST_KEY + numkeys];
    let mut loaded = load::<PackedBucket>(ctx, names, write)?;
    let states: SmallVec<[Option<BucketState>; INLINE]> =
        (0..numkeys).map(|i| loaded.get(i).map(PackedBucket::unpack)).collect();
    let outcome = op(buckets, &states, now);
    let d = outcome.decision;
    if write && d.allowed() {
        let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
        let mut failed = None;
        for (i, update) in outcome.updates.iter().enumerate() {
            match *update {
                Update::Store { state, expires_at_ms } => {
                    let packed = PackedBucket::pack(&state);
                    if let Err(e) = loaded.store(i, packed, expires_at_ms) {
                        // Cannot happen on a key opened for writing; still
                        // replicate what was written so far.
                        failed = Some(e);
                        break;
                    }
                    effects.push(Effect::Store { key: names[i], blob: SmallVec::from_slice(&packed.to_blob()), expires_at_ms });
                }
                // Full: no key. Nothing to do (or replicate) if there was none.
                Update::Remove if loaded.get(i).is_none() => {}
                Update::Remove => {
                    loaded.remove(i);
                    effects.push(Effect::Remove { key: names[i] });
                }
            }
        }
        replicate(ctx, &effects);
        if let Some(e) = failed {
            return Err(e);
        }
    } else if write {
        loaded.keep_until(ctx, names, outcome.keep_until_ms.iter().copied());
    }
    reply_decision(ctx, &d, first(&d));
    Ok(if d.allowed() { Verdict::Allowed } else { Verdict::Denied })
}
