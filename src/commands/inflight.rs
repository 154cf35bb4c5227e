//! In-flight limits: RL.ACQUIRE takes a slot in several keys at once (all or
//! nothing), RL.RELEASE gives it back, RL.INFLIGHT answers as RL.ACQUIRE
//! would without taking anything. A slot not released heals at its
//! deadline on the server's clock.

use redis_module::raw::RedisModuleString;
use rl_core::inflight::{self, Slots};
use rl_core::INLINE;
use smallvec::SmallVec;

use super::outcome::{carry_out, write};
use super::{arg_bytes, numkeys_keys};
use crate::args;
use crate::ffi::Ctx;
use crate::stats::{self, Counted};
use crate::store::keys::load;
use crate::{clock, config};

/// Length of an id the module makes: 32 hex characters, 128 random bits.
const GENERATED_ID_LEN: usize = 32;

pub fn acquire(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, true)
}

pub fn peek(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    run(ctx, argv, false)
}

/// Reply: `[allowed, in_flight, retry_after_ms, limit, binding, id]`.
fn run(ctx: Ctx, argv: &[*mut RedisModuleString], write: bool) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    let keys = numkeys_keys(argv, &bytes)?;
    let a = args::parse_acquire(&bytes, config::max_inflight_limit()).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let names = keys.names();
    let mut generated = [0u8; GENERATED_ID_LEN];
    let id: &[u8] = match a.id {
        Some(id) => id,
        None if write => {
            ctx.random_hex(&mut generated);
            &generated
        }
        // RL.INFLIGHT without an id: no slot is held by "nobody".
        None => b"",
    };
    let mut loaded = load::<Slots>(ctx, keys, write)?;
    let (outcome, in_flight) = {
        let sets: SmallVec<[Option<&Slots>; INLINE]> = (0..a.numkeys).map(|i| loaded.get(i)).collect();
        let outcome = inflight::acquire(&a.limits, &sets, id, a.cost, now);
        let d = &outcome.decision;
        let in_flight = inflight::in_flight(sets[d.binding], id, a.cost, d.allowed(), now);
        (outcome, in_flight)
    };
    if write {
        carry_out(ctx, c"rl.acquire", names, &mut loaded, &outcome)?;
    }
    let d = &outcome.decision;
    ctx.reply_array(6);
    ctx.reply_integer(d.allowed() as i64);
    ctx.reply_integer(in_flight as i64);
    ctx.reply_integer(d.retry_after_ms);
    ctx.reply_integer(d.limit as i64);
    ctx.reply_integer(d.binding as i64);
    ctx.reply_bulk(id);
    Ok(if d.allowed() { Counted::Allowed } else { Counted::Denied })
}

/// Reply: the number of keys where `id` held a slot it gave back (0: an
/// unknown, released or expired id; nothing is written then).
pub fn release(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let bytes = arg_bytes(argv);
    let keys = numkeys_keys(argv, &bytes)?;
    let (numkeys, id) = args::parse_release(&bytes).map_err(|e| e.0)?;
    let now = clock::now_ms()?;
    let names = keys.names();
    let mut loaded = load::<Slots>(ctx, keys, true)?;
    let updates = {
        let sets: SmallVec<[Option<&Slots>; INLINE]> = (0..numkeys).map(|i| loaded.get(i)).collect();
        inflight::release(&sets, id, now)
    };
    let released = updates.iter().flatten().count();
    write(
        ctx,
        c"rl.release",
        names,
        &mut loaded,
        updates.iter().enumerate().filter_map(|(i, u)| Some((i, u.as_ref()?))),
    )?;
    if released == 0 {
        stats::RELEASE_UNKNOWN.add(1);
    }
    ctx.reply_integer(released as i64);
    Ok(Counted::Done)
}
