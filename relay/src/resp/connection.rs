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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::auth_guard::CLOSE_AFTER;
use super::encode::{Protocol, Writer};
use super::reader::{ReadError, Reader};
use super::session::{Session, Step};
use super::Front;
use crate::reply::Reply;
use crate::Relay;

/// Answers queued per connection, in the order of their requests.
const QUEUED: usize = 1024;

/// After a protocol error, what of the client's further bytes is read and
/// dropped before closing, so the error is not lost to a reset.
const DRAIN_BYTES: usize = 1 << 20;
const DRAIN_FOR: Duration = Duration::from_millis(500);

/// How long the last answers of a connection the relay closes may take to
/// go out before it is dropped.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

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

/// Serves a connection's two halves (a TCP socket's, or a TLS stream's)
/// until it ends; `peer` names the client in the log.
pub(super) async fn run<R, W>(relay: Arc<Relay>, front: Arc<Front>, read: R, write: W, peer: String, id: u64)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = relay.limits;
    let mut requests = FramedRead::with_capacity(read, Reader::new(limits), 8 << 10);
    let (answers, mut queue) = mpsc::channel::<Answer>(QUEUED);
    let writer = tokio::spawn(async move {
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
    // Unauthenticated, a connection has until then (from its accept, or
    // from the RESET that logged it out), whatever it sends meanwhile, and
    // every wait of the loop ends there: a client that never reads fills
    // its queue and budget, and must not hold its slot by it.
    let mut auth_deadline = Instant::now() + limits.auth_timeout;
    let mut auth_failures = 0u32;
    let end = loop {
        let deadline = (!session.authenticated()).then_some(auth_deadline);
        let Some(next) = before(deadline, requests.next()).await else { break End::AuthTimeout };
        let request = match next {
            Some(Ok(request)) => request,
            Some(Err(ReadError::Protocol(e))) => {
                relay.counters.protocol_errors.fetch_add(1, Relaxed);
                if let Some(Ok(permit)) = before(deadline, budget.clone().acquire_owned()).await {
                    let error =
                        Answer { protocol: session.protocol, reply: Pending::Ready(Reply::error(e)), _budget: permit };
                    let _ = before(deadline, answers.send(error)).await;
                }
                break End::Refused;
            }
            Some(Err(ReadError::Io(_))) | None => break End::Closed,
        };
        let charge = limits.charge(request.bytes, request.args.len());
        let permit = match before(deadline, budget.clone().acquire_many_owned(charge)).await {
            None => break End::AuthTimeout,
            Some(Err(_)) => break End::Closed,
            Some(Ok(permit)) => permit,
        };
        let (mut close, mut refuse) = (false, false);
        let was_authenticated = session.authenticated();
        let step = session.step(&request.args, &relay.credentials);
        if was_authenticated && !session.authenticated() {
            auth_deadline = Instant::now() + limits.auth_timeout;
        }
        let reply = match step {
            Step::Relay => match front.fence.refusal(&request.args, &relay.counters) {
                Some(error) => Pending::Ready(Reply::error(error)),
                None => {
                    let relay = relay.clone();
                    Pending::Later(tokio::spawn(async move { relay.call(request.args).await }))
                }
            },
            Step::Answer(reply) => Pending::Ready(reply),
            Step::Info => Pending::Ready(info(&relay, &request.args)),
            Step::Close(reply) => {
                close = true;
                Pending::Ready(reply)
            }
            Step::AuthFailed(reply) => {
                relay.counters.auth_failures.fetch_add(1, Relaxed);
                auth_failures += 1;
                // Slowed here, before reading on: pipelined guesses wait too.
                let wait = front.auth_guard.wait(auth_failures, std::time::Instant::now());
                if !wait.is_zero() {
                    relay.counters.auth_delayed.fetch_add(1, Relaxed);
                    let deadline = (!session.authenticated()).then_some(auth_deadline);
                    if before(deadline, tokio::time::sleep(wait)).await.is_none() {
                        break End::AuthTimeout;
                    }
                }
                if auth_failures >= CLOSE_AFTER {
                    relay.counters.auth_closed.fetch_add(1, Relaxed);
                    front.auth_guard.log.log(|| {
                        format!("closed a connection from {peer} after {CLOSE_AFTER} failed authentication attempts")
                    });
                    refuse = true;
                    Pending::Ready(Reply::error(format!(
                        "ERR relay: {CLOSE_AFTER} failed authentication attempts on this connection, closing it"
                    )))
                } else {
                    Pending::Ready(reply)
                }
            }
            Step::Refused(reply) => {
                relay.counters.refused_commands.fetch_add(1, Relaxed);
                Pending::Ready(reply)
            }
        };
        // A HELLO's own answer is in the protocol it chose.
        let answer = Answer { protocol: session.protocol, reply, _budget: permit };
        let deadline = (!session.authenticated()).then_some(auth_deadline);
        match before(deadline, answers.send(answer)).await {
            None => break End::AuthTimeout,
            Some(Err(_)) => break End::Closed,
            Some(Ok(())) if close => break End::Closed,
            Some(Ok(())) if refuse => break End::Refused,
            Some(Ok(())) => {}
        }
    };
    match end {
        End::Closed => {
            drop(answers);
            let _ = writer.await;
        }
        End::Refused => {
            drop(answers);
            let read = requests.into_inner();
            tokio::join!(drain(read), finish(writer));
        }
        End::AuthTimeout => {
            relay.counters.auth_timeouts.fetch_add(1, Relaxed);
            let error = format!(
                "ERR relay: not authenticated within {} ms, closing the connection",
                limits.auth_timeout.as_millis()
            );
            if let Ok(permit) = budget.clone().try_acquire_owned() {
                let reply = Pending::Ready(Reply::error(error));
                let _ = answers.try_send(Answer { protocol: session.protocol, reply, _budget: permit });
            }
            drop(answers);
            finish(writer).await;
        }
    }
}

/// Why a connection's read loop ended.
enum End {
    /// The client closed it, or asked to (QUIT).
    Closed,
    /// The relay goes no further (a protocol error, too many failed
    /// authentications), and said why: what the client still sends is
    /// drained, so the answer is not lost to a reset, then closed.
    Refused,
    /// Not authenticated by the deadline.
    AuthTimeout,
}

/// `f`'s output, or `None` once `deadline` (if any) has passed.
async fn before<F: std::future::Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, f).await.ok(),
        None => Some(f.await),
    }
}

/// The writer's last answers, for a moment: a connection the relay closes
/// is not held open by a client that does not read them.
async fn finish(mut writer: JoinHandle<()>) {
    if tokio::time::timeout(CLOSE_WITHIN, &mut writer).await.is_err() {
        writer.abort();
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
async fn drain<R: AsyncRead + Unpin>(mut read: R) {
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
