//! One client connection: requests read in order, answered in order, the
//! module's commands run concurrently (a gateway multiplexes its calls on
//! one connection). What a connection holds is bounded: a request by the
//! reader's ceilings, the requests read and not yet answered by
//! `max_pending_bytes` (past it the relay stops reading the connection, and
//! TCP pushes back on the client).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::encode::{Protocol, Writer};
use super::reader::{ReadError, Reader};
use super::session::{Session, Step};
use crate::reply::Reply;
use crate::Relay;

/// Answers queued per connection, in the order of their requests.
const QUEUED: usize = 1024;

/// After a protocol error, what of the client's further bytes is read and
/// dropped before closing, so the error is not lost to a reset.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_FOR: Duration = Duration::from_millis(500);

enum Pending {
    Ready(Reply),
    Later(JoinHandle<Reply>),
}

/// An answer to write, in the protocol in force when its request was read,
/// holding its request's share of the connection's budget until written.
struct Answer {
    protocol: Protocol,
    reply: Pending,
    _budget: OwnedSemaphorePermit,
}

pub(super) async fn run(relay: Arc<Relay>, socket: TcpStream, id: u64) {
    let _ = socket.set_nodelay(true);
    let (read, write) = socket.into_split();
    let limits = relay.limits;
    let mut requests = FramedRead::with_capacity(read, Reader::new(limits), 8 << 10);
    let (answers, mut queue) = mpsc::channel::<Answer>(QUEUED);
    let mut writer = tokio::spawn(async move {
        let mut out = FramedWrite::new(write, Writer);
        // Answers are written together while the next one is ready, and
        // flushed before waiting for one that is not.
        let mut unflushed = false;
        loop {
            let answer = match queue.try_recv() {
                Ok(answer) => answer,
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {
                    if std::mem::take(&mut unflushed) && out.flush().await.is_err() {
                        return;
                    }
                    match queue.recv().await {
                        Some(answer) => answer,
                        None => break,
                    }
                }
            };
            let reply = match answer.reply {
                Pending::Ready(reply) => reply,
                Pending::Later(task) => {
                    if !task.is_finished() && std::mem::take(&mut unflushed) && out.flush().await.is_err() {
                        return;
                    }
                    task.await.unwrap_or_else(|_| Reply::error("ERR relay: internal error"))
                }
            };
            if out.feed((answer.protocol, reply)).await.is_err() {
                return;
            }
            unflushed = true;
        }
        let _ = out.flush().await;
        let _ = out.get_mut().shutdown().await;
    });
    let budget = Arc::new(Semaphore::new(limits.max_pending_bytes));
    let mut session = Session::new(id, &relay.credentials);
    let mut protocol_error = false;
    // Unauthenticated, a connection has until then (from its accept, or
    // from the RESET that logged it out), whatever it sends meanwhile.
    let mut auth_deadline = tokio::time::Instant::now() + limits.auth_timeout;
    loop {
        let next = if session.authenticated() {
            requests.next().await
        } else {
            match tokio::time::timeout_at(auth_deadline, requests.next()).await {
                Ok(next) => next,
                Err(_) => {
                    relay.counters.auth_timeouts.fetch_add(1, Relaxed);
                    let error = format!(
                        "ERR relay: not authenticated within {} ms, closing the connection",
                        limits.auth_timeout.as_millis()
                    );
                    // A client that reads nothing gets no more of its slot than a moment.
                    if let Ok(permit) = budget.clone().try_acquire_owned() {
                        let _ = answers.try_send(Answer {
                            protocol: session.protocol,
                            reply: Pending::Ready(Reply::error(error)),
                            _budget: permit,
                        });
                    }
                    drop(answers);
                    if tokio::time::timeout(DRAIN_FOR, &mut writer).await.is_err() {
                        writer.abort();
                    }
                    return;
                }
            }
        };
        let request = match next {
            Some(Ok(request)) => request,
            Some(Err(ReadError::Protocol(e))) => {
                relay.counters.protocol_errors.fetch_add(1, Relaxed);
                let Ok(permit) = budget.clone().acquire_owned().await else { break };
                let error =
                    Answer { protocol: session.protocol, reply: Pending::Ready(Reply::error(e)), _budget: permit };
                let _ = answers.send(error).await;
                protocol_error = true;
                break;
            }
            Some(Err(ReadError::Io(_))) | None => break,
        };
        let charge = limits.charge(request.bytes, request.args.len());
        let Ok(permit) = budget.clone().acquire_many_owned(charge).await else { break };
        let mut close = false;
        let was_authenticated = session.authenticated();
        let step = session.step(&request.args, &relay.credentials);
        if was_authenticated && !session.authenticated() {
            auth_deadline = tokio::time::Instant::now() + limits.auth_timeout;
        }
        let reply = match step {
            Step::Relay => {
                let relay = relay.clone();
                Pending::Later(tokio::spawn(async move { relay.call(request.args).await }))
            }
            Step::Answer(reply) => Pending::Ready(reply),
            Step::Info => Pending::Ready(info(&relay, &request.args)),
            Step::Close(reply) => {
                close = true;
                Pending::Ready(reply)
            }
            Step::AuthFailed(reply) => {
                relay.counters.auth_failures.fetch_add(1, Relaxed);
                Pending::Ready(reply)
            }
            Step::Refused(reply) => {
                relay.counters.refused_commands.fetch_add(1, Relaxed);
                Pending::Ready(reply)
            }
        };
        // A HELLO's own answer is in the protocol it chose.
        if answers.send(Answer { protocol: session.protocol, reply, _budget: permit }).await.is_err() || close {
            break;
        }
    }
    drop(answers);
    if protocol_error {
        let read = requests.into_inner();
        let _ = tokio::join!(drain(read), writer);
    } else {
        let _ = writer.await;
    }
}

/// `INFO [section ...]`: the relay's section for none, `relay`, `default`,
/// `all` or `everything`; nothing for another section (as Redis answers an
/// unknown one).
fn info(relay: &Relay, args: &[bytes::Bytes]) -> Reply {
    let wanted = args.len() == 1
        || args[1..].iter().any(|s| {
            ["relay", "default", "all", "everything"].iter().any(|name| s.eq_ignore_ascii_case(name.as_bytes()))
        });
    Reply::bulk(if wanted { relay.info() } else { String::new() })
}

/// Reads and drops what the client still sends, for a moment.
async fn drain(mut read: OwnedReadHalf) {
    let mut buf = [0u8; 8192];
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while left > 0 {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}
