//! `algorithm: concurrency`: slots in flight on the module's RL.ACQUIRE /
//! RL.RELEASE (docs/token-budgets.md "Concurrency through Envoy").
//!
//! A request takes a slot named by its id (the descriptor's last entry:
//! Envoy's `request_headers` action sending `x-request-id`), the negative
//! hit at stream end gives it back. A slot never given back (Envoy died, a
//! release lost) heals at its deadline, one `unit` after it was taken. A
//! release repeated, or of an id that holds nothing, is a no-op in the
//! module: never more room than was taken. The same id asked again (Envoy
//! retrying the call) renews its slot instead of taking a second one.

use bytes::Bytes;
use rl_core::Reply;

use crate::reply::Reply as Resp;

/// `RL.ACQUIRE 1 key limit timeout_ms ID id COST n`, or `RL.INFLIGHT` (a
/// look: `cost` 0, asked as 1).
pub fn acquire_args(key: &str, limit: u64, timeout_ms: u64, id: &str, cost: u64) -> Vec<Bytes> {
    let name: &'static [u8] = if cost == 0 { b"RL.INFLIGHT" } else { b"RL.ACQUIRE" };
    let mut args = vec![Bytes::from_static(name), Bytes::from_static(b"1"), Bytes::copy_from_slice(key.as_bytes())];
    args.push(limit.to_string().into());
    args.push(timeout_ms.to_string().into());
    args.push(Bytes::from_static(b"ID"));
    args.push(Bytes::copy_from_slice(id.as_bytes()));
    args.push(Bytes::from_static(b"COST"));
    args.push(cost.max(1).to_string().into());
    args
}

/// `RL.RELEASE 1 key ID id`.
pub fn release_args(key: &str, id: &str) -> Vec<Bytes> {
    vec![
        Bytes::from_static(b"RL.RELEASE"),
        Bytes::from_static(b"1"),
        Bytes::copy_from_slice(key.as_bytes()),
        Bytes::from_static(b"ID"),
        Bytes::copy_from_slice(id.as_bytes()),
    ]
}

/// RL.ACQUIRE's or RL.INFLIGHT's reply `[allowed, in_flight, retry_after_ms,
/// limit, binding, id]` as a limit's: `remaining` the slots left, the
/// reset the wait for one.
pub fn reply(resp: &Resp) -> Option<Reply> {
    let Resp::Array(items) = resp else { return None };
    let [allowed, in_flight, retry, limit, binding, _id] = &items[..] else { return None };
    let int = |r: &Resp| if let Resp::Int(i) = r { Some(*i) } else { None };
    let (in_flight, limit) = (u64::try_from(int(in_flight)?).ok()?, u64::try_from(int(limit)?).ok()?);
    let retry_after_ms = int(retry)?;
    Some(Reply {
        granted: u64::try_from(int(allowed)?).ok()?,
        remaining: limit.saturating_sub(in_flight),
        retry_after_ms,
        reset_after_ms: u64::try_from(retry_after_ms).unwrap_or(0),
        limit,
        binding: usize::try_from(int(binding)?).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acquire_reply_reads_as_slots_left() {
        let r = Resp::Array(vec![
            Resp::Int(0),
            Resp::Int(20),
            Resp::Int(1500),
            Resp::Int(20),
            Resp::Int(0),
            Resp::bulk(&b"req-7"[..]),
        ]);
        let read = reply(&r).unwrap();
        assert_eq!((read.granted, read.remaining, read.retry_after_ms, read.reset_after_ms), (0, 0, 1500, 1500));
        assert_eq!(reply(&Resp::Int(1)), None);
        let args = acquire_args("k", 20, 60_000, "req-7", 0);
        assert_eq!(args[0], "RL.INFLIGHT");
        assert_eq!(args.last().unwrap(), "1");
    }
}
