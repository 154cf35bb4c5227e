//! RL.TAKE and RL.PEEK: several token buckets refilled, checked and debited
//! (or, for PEEK, only checked) in one step on the server's clock.

use std::ptr::NonNull;

use redis_module::raw::RedisModuleString;
use rl_core::acquire::INLINE;
use rl_core::codec::PackedBucket;
use rl_core::{BucketState, Decision, Update};
use smallvec::SmallVec;

use super::{arg_bytes, replicate_set, reply_decision, wrongtype, Effect};
use crate::args::{self, FIRST_KEY};
use crate::clock;
use crate::ffi::{Ctx, Held, Key};
use crate::stats::Verdict;
use crate::store::bucket_type::bucket_type;

pub fn take(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    decide(ctx, argv, true)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    decide(ctx, argv, false)
}

fn decide(ctx: Ctx, argv: &[*mut RedisModuleString], write: bool) -> Result<Verdict, String> {
    let req = args::parse_take(&arg_bytes(argv)).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let ty = bucket_type();
    let names = &argv[FIRST_KEY..FIRST_KEY + req.numkeys];
    let keys: SmallVec<[Key; INLINE]> = names.iter().map(|&n| Key::open(ctx, n, write)).collect();
    let mut values: SmallVec<[Option<NonNull<PackedBucket>>; INLINE]> = SmallVec::new();
    let mut states: SmallVec<[Option<BucketState>; INLINE]> = SmallVec::new();
    for key in &keys {
        let value = match key.held::<PackedBucket>(ty) {
            Held::Nothing => None,
            Held::Ours(v) => Some(v),
            Held::Other => return Err(wrongtype()),
        };
        // SAFETY: the value belongs to the open key and lives while it does.
        states.push(value.map(|v| unsafe { v.as_ref() }.unpack()));
        values.push(value);
    }
    let outcome = rl_core::acquire(&req.buckets, &states, req.cost, req.cost, now);
    let decision: Decision = outcome.decision;
    if write && decision.allowed() {
        let mut effects: SmallVec<[Effect; INLINE]> = SmallVec::new();
        let mut failed = false;
        for (i, update) in outcome.updates.iter().enumerate() {
            effects.push(match *update {
                Update::Store { state, expires_at_ms } => {
                    let packed = PackedBucket::pack(&state);
                    match values[i] {
                        // In place: no allocation for a bucket that exists.
                        Some(v) => unsafe { *v.as_ptr() = packed },
                        None => {
                            if !keys[i].set_value(ty, Box::new(packed)) {
                                // Cannot happen on a key opened for writing;
                                // still replicate what was written so far.
                                failed = true;
                                break;
                            }
                        }
                    }
                    keys[i].set_expire_at(expires_at_ms as i64);
                    Effect::Store { key: names[i], blob: SmallVec::from_slice(&packed.to_blob()), expires_at_ms }
                }
                Update::Remove => {
                    keys[i].delete();
                    Effect::Remove { key: names[i] }
                }
            });
        }
        replicate_set(ctx, &effects);
        if failed {
            return Err("ERR could not store a bucket; the others were written".into());
        }
    }
    reply_decision(ctx, &decision, decision.allowed() as i64);
    Ok(if decision.allowed() { Verdict::Allowed } else { Verdict::Denied })
}
