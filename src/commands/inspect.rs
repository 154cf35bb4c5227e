//! RL.INSPECT: what one limiter key holds, decoded, for an operator asking
//! at 3 a.m. why a limit behaves as it does (no DUMP decoding by hand).
//! Read-only; answers for every kind of key the module writes.

use redis_module::raw::RedisModuleString;
use rl_core::codec::{PackedBucket, PackedWindow, VERSION_1};
use rl_core::exact_log::Log;
use rl_core::inflight::Slots;

use crate::args::named_twice;
use crate::clock;
use crate::ffi::{Ctx, Key};
use crate::stats::Counted;
use crate::store;
use crate::store::keys::{load, DistinctKeys};

/// Slots listed at most (the counts cover all of them).
const LISTED_SLOTS: usize = 20;

/// A field of the reply.
enum Field<'a> {
    Int(i64),
    Text(&'a [u8]),
    Slots(&'a Slots),
}

pub fn inspect(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Counted, String> {
    let [_, name] = argv else {
        return Err("ERR wrong number of arguments for 'rl.inspect' command: RL.INSPECT key".into());
    };
    let now = clock::now_ms()? as i64;
    let key = Key::open(ctx, *name, false);
    // One name: distinct by itself.
    let one = DistinctKeys::new(std::slice::from_ref(name)).map_err(named_twice)?;
    let expires_at = key.expire_at().unwrap_or(-1);
    let mut fields: Vec<(&str, Field)> = Vec::new();
    let ty = key.module_type();
    let loaded_bucket;
    let loaded_window;
    let loaded_log;
    let loaded_slots;
    let kind: &[u8] = match ty {
        Ok(None) => b"none",
        Ok(Some(t)) if t == store::handle::<PackedBucket>() => {
            loaded_bucket = load::<PackedBucket>(ctx, one, false)?;
            let s = loaded_bucket.get(0).map(PackedBucket::unpack).ok_or("ERR the key vanished")?;
            fields.extend([
                ("tokens", Field::Int(s.tokens)),
                ("fraction", Field::Int(s.fraction as i64)),
                ("updated_ms", Field::Int(s.updated_ms as i64)),
                // Above 0: stamped ahead of the clock (the next call re-stamps it).
                ("stamped_ahead_ms", Field::Int((s.updated_ms as i64 - now).max(0))),
            ]);
            b"bucket"
        }
        Ok(Some(t)) if t == store::handle::<PackedWindow>() => {
            loaded_window = load::<PackedWindow>(ctx, one, false)?;
            let s = loaded_window.get(0).map(PackedWindow::unpack).ok_or("ERR the key vanished")?;
            fields.extend([
                ("window_start_ms", Field::Int(s.start_ms as i64)),
                ("previous", Field::Int(s.previous as i64)),
                ("current", Field::Int(s.current as i64)),
            ]);
            b"window"
        }
        Ok(Some(t)) if t == store::handle::<Log>() => {
            loaded_log = load::<Log>(ctx, one, false)?;
            let log = loaded_log.get(0).ok_or("ERR the key vanished")?;
            let at = |e: Option<rl_core::exact_log::Entry>| e.map_or(-1, |e| e.at_ms() as i64);
            fields.extend([
                ("entries", Field::Int(log.len() as i64)),
                ("requests", Field::Int(log.entries().map(|e| e.count()).sum::<u64>() as i64)),
                ("oldest_ms", Field::Int(at(log.entries().next()))),
                ("newest_ms", Field::Int(at(log.entries().last()))),
            ]);
            b"exact-log"
        }
        Ok(Some(t)) if t == store::handle::<Slots>() => {
            loaded_slots = load::<Slots>(ctx, one, false)?;
            let set = loaded_slots.get(0).ok_or("ERR the key vanished")?;
            let live = set.slots().iter().filter(|s| s.deadline_ms as i64 > now);
            fields.extend([
                ("slots", Field::Int(set.slots().len() as i64)),
                ("in_flight", Field::Int(live.map(|s| s.count).sum::<u64>() as i64)),
                // Past their deadline, not yet left out: lost releases.
                ("expired", Field::Int(set.expired(now as u64) as i64)),
                ("latest_deadline_ms", Field::Int(set.latest_deadline_ms().map_or(-1, |d| d as i64))),
                ("slot_list", Field::Slots(set)),
            ]);
            b"inflight"
        }
        Ok(Some(_)) => b"other-module-type",
        Err(()) => match key.string() {
            Ok(Some(raw)) => {
                // CL.THROTTLE keeps its TAT here, in ns.
                fields.push(("value", Field::Text(raw)));
                b"string"
            }
            _ => b"other",
        },
    };
    ctx.reply_array(2 * (4 + fields.len()));
    reply_field(ctx, "kind", &Field::Text(kind));
    let version = if matches!(ty, Ok(Some(_))) && kind != b"other-module-type" { VERSION_1 as i64 } else { -1 };
    reply_field(ctx, "encoding_version", &Field::Int(version));
    reply_field(ctx, "now_ms", &Field::Int(now));
    reply_field(ctx, "expires_at_ms", &Field::Int(expires_at));
    for (name, value) in &fields {
        reply_field(ctx, name, value);
    }
    Ok(Counted::Done)
}

fn reply_field(ctx: Ctx, name: &str, value: &Field) {
    ctx.reply_bulk(name.as_bytes());
    match value {
        Field::Int(v) => ctx.reply_integer(*v),
        Field::Text(t) => ctx.reply_bulk(t),
        Field::Slots(set) => {
            let listed = &set.slots()[..set.slots().len().min(LISTED_SLOTS)];
            ctx.reply_array(listed.len());
            for s in listed {
                ctx.reply_array(3);
                ctx.reply_bulk(&s.id);
                ctx.reply_integer(s.deadline_ms as i64);
                ctx.reply_integer(s.count as i64);
            }
        }
    }
}
