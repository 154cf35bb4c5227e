//! RL.SET key blob pxat [key blob pxat ...]: the internal command that carries
//! the effect of a write to replicas and the AOF.
//!
//! It is deterministic: the state and expiry are absolute, so a replica or an
//! AOF replay ends with exactly the primary's bucket. An empty blob means the
//! bucket is full, which is the same as no key. It checks its arguments like
//! any public command and writes nothing unless all of them are valid.

use redis_module::raw::RedisModuleString;
use rl_core::codec::{self, PackedBucket, Stored};
use smallvec::SmallVec;

use super::{arg_bytes, wrongtype};
use crate::args::{int, shown};
use crate::ffi::{Ctx, Held, Key};
use crate::stats::Verdict;
use crate::store::bucket_type::bucket_type;

pub fn set(ctx: Ctx, argv: &[*mut RedisModuleString]) -> Result<Verdict, String> {
    let bytes = arg_bytes(argv);
    if bytes.len() < 4 || (bytes.len() - 1) % 3 != 0 {
        return Err("ERR wrong number of arguments for 'rl.set' command: expected key blob pxat triples".into());
    }
    // Check everything before writing anything.
    let mut writes: SmallVec<[(usize, Option<PackedBucket>, i64); 4]> = SmallVec::new();
    for (i, t) in bytes[1..].chunks_exact(3).enumerate() {
        let value = match t[1] {
            [] => None,
            blob => match codec::decode(blob) {
                Ok(Stored::Bucket(p)) => Some(p),
                Err(e) => return Err(format!("ERR RL.SET key '{}': {e}", shown(t[0]))),
            },
        };
        let at = int(t[2])
            .and_then(|v| i64::try_from(v).ok())
            .ok_or_else(|| format!("ERR RL.SET pxat must be a non-negative integer, got '{}'", shown(t[2])))?;
        writes.push((1 + 3 * i, value, at));
    }
    let ty = bucket_type();
    let keys: SmallVec<[Key; 4]> = writes.iter().map(|&(pos, ..)| Key::open(ctx, argv[pos], true)).collect();
    let mut held: SmallVec<[Option<std::ptr::NonNull<PackedBucket>>; 4]> = SmallVec::new();
    for key in &keys {
        held.push(match key.held::<PackedBucket>(ty) {
            Held::Nothing => None,
            Held::Ours(v) => Some(v),
            Held::Other => return Err(wrongtype()),
        });
    }
    for ((key, (_, value, at)), existing) in keys.iter().zip(&writes).zip(&held) {
        let Some(value) = value else {
            key.delete();
            continue;
        };
        match existing {
            Some(v) => unsafe { *v.as_ptr() = *value },
            None => {
                if !key.set_value(ty, Box::new(*value)) {
                    return Err("ERR could not store the bucket".into());
                }
            }
        }
        // 0 = no expiry (AOF rewrite: the server appends PEXPIREAT itself).
        key.set_expire_at(if *at == 0 { -1 } else { *at });
    }
    ctx.replicate_verbatim();
    ctx.reply_ok();
    Ok(Verdict::Done)
}
