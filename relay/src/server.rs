//! The relay as a RESP server: gateways connect as to Redis; RL.TAKE and
//! RL.LEASE are served from the pools, everything else is forwarded.
//!
//! Commands of one connection run concurrently (a gateway multiplexes its
//! calls on one connection) and are answered in the order they came.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use redis::Value;
use redis_protocol::codec::Resp2;
use redis_protocol::resp2::types::BytesFrame;
use rl_core::Reply;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::command::Call;
use crate::pool::{Need, Plan, Pools};
use crate::upstream::Upstream;

/// Relay-wide counters (per-subject ones live in the pools).
#[derive(Debug, Default)]
pub struct Counters {
    /// RL.TAKE and RL.LEASE calls received.
    pub requests: AtomicU64,
    /// Of those, answered from memory (paid or refused).
    pub from_memory: AtomicU64,
    /// RL.LEASE calls sent to Redis (a request waiting, or a top-up).
    pub upstream_leases: AtomicU64,
    /// Commands forwarded as they came.
    pub forwarded: AtomicU64,
    /// Calls to Redis that failed (timeout, connection).
    pub upstream_failures: AtomicU64,
}

pub struct Relay {
    pools: Mutex<Pools>,
    upstream: Upstream,
    timeout: Duration,
    pub counters: Counters,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn error(text: impl Into<String>) -> BytesFrame {
    BytesFrame::Error(text.into().into())
}

/// The module's six-integer reply; RL.TAKE's first field is allowed (0/1).
fn six(reply: Reply, lease: bool) -> BytesFrame {
    let first = if lease { reply.granted as i64 } else { i64::from(reply.granted > 0) };
    let fields = [
        first,
        reply.remaining as i64,
        reply.retry_after_ms,
        reply.reset_after_ms as i64,
        reply.limit as i64,
        reply.binding as i64,
    ];
    BytesFrame::Array(fields.into_iter().map(BytesFrame::Integer).collect())
}

/// RL.LEASE's reply as redis-rs read it.
fn parse_reply(value: &Value) -> Option<Reply> {
    let Value::Array(items) = value else { return None };
    let ints: Vec<i64> =
        items.iter().map(|v| if let Value::Int(i) = v { Some(*i) } else { None }).collect::<Option<_>>()?;
    let [granted, remaining, retry_after_ms, reset_after_ms, limit, binding] = ints[..] else { return None };
    Some(Reply {
        granted: u64::try_from(granted).ok()?,
        remaining: u64::try_from(remaining).ok()?,
        retry_after_ms,
        reset_after_ms: u64::try_from(reset_after_ms).ok()?,
        limit: u64::try_from(limit).ok()?,
        binding: usize::try_from(binding).ok()?,
    })
}

/// A redis-rs value as a RESP2 frame (RESP3-only types flattened).
fn frame(value: Value) -> BytesFrame {
    match value {
        Value::Nil => BytesFrame::Null,
        Value::Int(i) => BytesFrame::Integer(i),
        Value::BulkString(b) => BytesFrame::BulkString(b.into()),
        Value::SimpleString(s) => BytesFrame::SimpleString(s.into()),
        Value::Okay => BytesFrame::SimpleString("OK".into()),
        Value::Array(items) | Value::Set(items) => BytesFrame::Array(items.into_iter().map(frame).collect()),
        Value::Map(pairs) => BytesFrame::Array(pairs.into_iter().flat_map(|(k, v)| [frame(k), frame(v)]).collect()),
        Value::ServerError(e) => {
            let code = e.code();
            error(match e.details() {
                Some(details) => format!("{code} {details}"),
                None => code.to_string(),
            })
        }
        other => BytesFrame::BulkString(format!("{other:?}").into()),
    }
}

/// Relay errors in words the gateway's breaker counts as a shard failure.
fn unavailable(e: impl std::fmt::Display) -> BytesFrame {
    error(format!("TRYAGAIN relay: Redis unavailable: {e}"))
}

impl Relay {
    pub fn new(pools: Pools, upstream: Upstream, timeout: Duration) -> Relay {
        Relay { pools: Mutex::new(pools), upstream, timeout, counters: Counters::default() }
    }

    pub fn pools(&self) -> MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Accepts gateways on `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((socket, _)) = listener.accept().await else { continue };
            tokio::spawn(self.clone().connection(socket));
        }
    }

    async fn connection(self: Arc<Self>, socket: TcpStream) {
        let _ = socket.set_nodelay(true);
        let (read, write) = socket.into_split();
        let mut frames = FramedRead::new(read, Resp2::default());
        let mut out = FramedWrite::new(write, Resp2::default());
        let (answers, mut pending) = mpsc::channel::<tokio::task::JoinHandle<BytesFrame>>(1024);
        let writer = tokio::spawn(async move {
            while let Some(answer) = pending.recv().await {
                let reply = answer.await.unwrap_or_else(|_| error("ERR relay: internal error"));
                if out.send(reply).await.is_err() {
                    break;
                }
            }
        });
        while let Some(Ok(request)) = frames.next().await {
            let relay = self.clone();
            let answer = tokio::spawn(async move {
                match arguments(request) {
                    Some(args) => relay.handle(args).await,
                    None => error("ERR relay: a command is an array of bulk strings"),
                }
            });
            if answers.send(answer).await.is_err() {
                break;
            }
        }
        drop(answers);
        let _ = writer.await;
    }

    pub async fn handle(self: &Arc<Self>, args: Vec<Bytes>) -> BytesFrame {
        let name = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
        match name.as_slice() {
            b"PING" => return BytesFrame::SimpleString("PONG".into()),
            // Connection settings of the gateway's own connection (redis-rs
            // sends CLIENT SETINFO): not for the shared upstream one.
            b"CLIENT" | b"QUIT" => return BytesFrame::SimpleString("OK".into()),
            b"SELECT" if args.get(1).is_some_and(|db| db.as_ref() == b"0") => {
                return BytesFrame::SimpleString("OK".into())
            }
            b"SELECT" => return error("ERR relay: only database 0"),
            b"HELLO" => return error("NOPROTO relay: RESP2 only"),
            // State of one connection would land on the shared upstream one.
            b"AUTH" | b"MULTI" | b"EXEC" | b"DISCARD" | b"WATCH" | b"UNWATCH" | b"SUBSCRIBE" | b"PSUBSCRIBE"
            | b"SSUBSCRIBE" | b"MONITOR" | b"BLPOP" | b"BRPOP" | b"BLMOVE" | b"BZPOPMIN" | b"BZPOPMAX" | b"XREAD" => {
                let name = String::from_utf8_lossy(&name);
                return error(format!(
                    "ERR relay: {name} is not relayed (it needs a connection of its own); connect to Redis for it"
                ));
            }
            b"INFO" if args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(b"relay")) => {
                return BytesFrame::BulkString(crate::stats::info(self).into())
            }
            _ => {}
        }
        match Call::parse(&args) {
            Call::Buckets { lease, keys, params, need } => {
                self.counters.requests.fetch_add(1, Relaxed);
                let plan = self.pools().plan(&keys, &params, need, now_ms());
                self.answer(plan, lease, keys, params, need, &args).await
            }
            Call::Forward { key } => self.forward(&args, key.as_deref()).await,
        }
    }

    async fn answer(
        self: &Arc<Self>,
        plan: Plan,
        lease: bool,
        keys: Vec<Bytes>,
        params: Vec<rl_core::BucketParams>,
        need: Need,
        args: &[Bytes],
    ) -> BytesFrame {
        match plan {
            Plan::Answer { reply, top_up } => {
                self.counters.from_memory.fetch_add(1, Relaxed);
                if let Some(want) = top_up {
                    // In the background: the request is answered now.
                    let relay = self.clone();
                    tokio::spawn(async move { relay.top_up(keys, params, want).await });
                }
                six(reply, lease)
            }
            Plan::Lease { want, min } => {
                let call = lease_args(&keys, &params, want, min);
                match self.lease_call(&call, &keys).await {
                    Ok(upstream) => {
                        let reply = self.pools().settle(&keys, want, upstream, Some(need), now_ms());
                        six(reply.unwrap_or(Reply { granted: 0, ..upstream }), lease)
                    }
                    Err(e) => {
                        self.pools().failed(&keys);
                        e
                    }
                }
            }
            Plan::Forward => {
                let reply = self.forward(args, keys.first().map(|k| k.as_ref())).await;
                if let BytesFrame::Array(items) = &reply {
                    let ints: Option<Vec<Value>> = items
                        .iter()
                        .map(|f| if let BytesFrame::Integer(i) = f { Some(Value::Int(*i)) } else { None })
                        .collect();
                    if let Some(upstream) = ints.and_then(|v| parse_reply(&Value::Array(v))) {
                        self.pools().forwarded(&keys, &params, need, upstream, now_ms());
                    }
                }
                reply
            }
        }
    }

    /// A pool's background top-up: RL.LEASE WANT want MIN 1.
    async fn top_up(&self, keys: Vec<Bytes>, params: Vec<rl_core::BucketParams>, want: u64) {
        let call = lease_args(&keys, &params, want, 1);
        match self.lease_call(&call, &keys).await {
            Ok(upstream) => {
                self.pools().settle(&keys, want, upstream, None, now_ms());
            }
            Err(_) => self.pools().failed(&keys),
        }
    }

    /// One RL.LEASE to Redis and its reply; a failure is the frame to send.
    async fn lease_call(&self, call: &[Bytes], keys: &[Bytes]) -> Result<Reply, BytesFrame> {
        self.counters.upstream_leases.fetch_add(1, Relaxed);
        match tokio::time::timeout(self.timeout, self.upstream.call(call, keys.first().map(|k| k.as_ref()))).await {
            Ok(Ok(value)) => match parse_reply(&value) {
                Some(reply) => Ok(reply),
                None => Err(frame(value)),
            },
            Ok(Err(e)) => {
                self.counters.upstream_failures.fetch_add(1, Relaxed);
                Err(unavailable(e))
            }
            Err(_) => {
                self.counters.upstream_failures.fetch_add(1, Relaxed);
                Err(unavailable("timed out"))
            }
        }
    }

    async fn forward(&self, args: &[Bytes], key: Option<&[u8]>) -> BytesFrame {
        self.counters.forwarded.fetch_add(1, Relaxed);
        match tokio::time::timeout(self.timeout, self.upstream.call(args, key)).await {
            Ok(Ok(value)) => frame(value),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::Io || e.is_timeout() || e.is_connection_dropped() => {
                self.counters.upstream_failures.fetch_add(1, Relaxed);
                unavailable(e)
            }
            Ok(Err(e)) => frame_of_error(&e),
            Err(_) => {
                self.counters.upstream_failures.fetch_add(1, Relaxed);
                unavailable("timed out")
            }
        }
    }
}

/// A server error redis-rs raised instead of returning: its code and text.
fn frame_of_error(e: &redis::RedisError) -> BytesFrame {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => error(format!("{code} {detail}")),
        (Some(code), None) => error(code.to_string()),
        _ => error(format!("ERR relay: {e}")),
    }
}

fn lease_args(keys: &[Bytes], params: &[rl_core::BucketParams], want: u64, min: u64) -> Vec<Bytes> {
    let mut args = Vec::with_capacity(4 + keys.len() * 4 + 4);
    args.push(Bytes::from_static(b"RL.LEASE"));
    args.push(keys.len().to_string().into());
    args.extend(keys.iter().cloned());
    for p in params {
        for n in [p.capacity(), p.refill(), p.period_ms()] {
            args.push(n.to_string().into());
        }
    }
    for (name, n) in [("WANT", want), ("MIN", min)] {
        args.push(Bytes::from_static(name.as_bytes()));
        args.push(n.to_string().into());
    }
    args
}

/// A request frame's arguments: an array of bulk (or simple) strings.
fn arguments(request: BytesFrame) -> Option<Vec<Bytes>> {
    let BytesFrame::Array(items) = request else { return None };
    items
        .into_iter()
        .map(|item| match item {
            BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Some(b),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .filter(|args| !args.is_empty())
}
