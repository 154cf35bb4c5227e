//! Token bucket commands: RL.TAKE (with FORCE), RL.PEEK, RL.LEASE and
//! RL.REFUND. Each refills, checks and changes several buckets in one step
//! on the server's clock, or (PEEK) only checks.

use redis_module::raw::RedisModuleString;
use rl_core::codec::PackedBucket;
use rl_core::{BucketOp, BucketState, INLINE};
use smallvec::SmallVec;

use super::outcome::{carry_out, reply};
use super::{arg_bytes, numkeys_keys};
use crate::args::{self, ArgError, BucketArgs};
use crate::clock;
use crate::ffi::Ctx;
use crate::stats::Counted;
use crate::store::keys::load;

type Parse = fn(&[&[u8]]) -> Result<BucketArgs, ArgError>;

pub fn take(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, args::parse_take)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, args::parse_peek)
}

pub fn lease(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, args::parse_lease)
}

pub fn refund(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, args::parse_refund)
}

/// Loads the buckets, lets the core run the operation, carries out what it
/// decided and replies (a lease's first field is the tokens granted).
fn run(ctx: Ctx, argv: &[*mut RedisModuleString], parse: Parse) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    let keys = numkeys_keys(argv, &bytes)?;
    let a = parse(&bytes).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let names = keys.names();
    let write = a.op.writes();
    let mut loaded = load::<PackedBucket>(ctx, keys, write)?;
    let states: SmallVec<[Option<BucketState>; INLINE]> =
        (0..a.numkeys).map(|i| loaded.get(i).map(PackedBucket::unpack)).collect();
    let outcome = a.op.run(&a.buckets, &states, now);
    if write {
        let event = match a.op {
            BucketOp::Lease { .. } => c"rl.lease",
            BucketOp::Refund { .. } => c"rl.refund",
            _ => c"rl.take",
        };
        carry_out(ctx, event, names, &mut loaded, &outcome)?;
    }
    let d = &outcome.decision;
    let first = if let BucketOp::Lease { .. } = a.op { d.granted as i64 } else { d.allowed() as i64 };
    Ok(reply(ctx, d, first))
}
