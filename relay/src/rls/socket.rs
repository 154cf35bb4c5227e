//! The RLS front's listener and its connections: TCP, or a Unix socket
//! (`--rls-listen unix:PATH`, envoyproxy/ratelimit's GRPC_UDS), served
//! with the same bounds.

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::either::Either;

/// What `--rls-listen` names: `HOST:PORT`, or `unix:PATH`.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `address`. A Unix socket's path left by a relay that is gone
    /// (a socket nothing answers on) is taken over; any other file there
    /// refuses the start.
    pub async fn bind(address: &str) -> Result<Listener, String> {
        let Some(path) = address.strip_prefix("unix:") else {
            let listener = TcpListener::bind(address).await.map_err(|e| format!("--rls-listen {address}: {e}"))?;
            return Ok(Listener::Tcp(listener));
        };
        let path = Path::new(path);
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(format!("--rls-listen {address}: a file that is not a socket is there"));
            }
            if UnixStream::connect(path).await.is_ok() {
                return Err(format!("--rls-listen {address}: another process listens on it"));
            }
            std::fs::remove_file(path).map_err(|e| format!("--rls-listen {address}: removing the old socket: {e}"))?;
        }
        let listener = UnixListener::bind(path).map_err(|e| format!("--rls-listen {address}: {e}"))?;
        Ok(Listener::Unix(listener, path.to_path_buf()))
    }

    pub async fn accept(&self) -> io::Result<Socket> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(Either::Left(stream))
            }
            Listener::Unix(l, _) => Ok(Either::Right(l.accept().await?.0)),
        }
    }

    /// Where it listens, for the log.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_else(|e| e.to_string()),
            Listener::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }
}

/// One connection of the front (tokio-util's `Either` reads and writes
/// through whichever it holds).
pub type Socket = Either<TcpStream, UnixStream>;

/// Its peer, for the log.
pub fn peer(socket: &Socket) -> String {
    match socket {
        Either::Left(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into()),
        Either::Right(_) => "the Unix socket".into(),
    }
}

/// Reads without taking (MSG_PEEK), as `TcpStream::peek`.
pub async fn peek(socket: &Socket, buf: &mut [u8]) -> io::Result<usize> {
    match socket {
        Either::Left(s) => s.peek(buf).await,
        Either::Right(s) => loop {
            s.readable().await?;
            let fd = s.as_raw_fd();
            // SAFETY: recv writes at most buf.len() bytes into buf.
            let peeked = s.try_io(Interest::READABLE, || {
                match unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) } {
                    n if n < 0 => Err(io::Error::last_os_error()),
                    n => Ok(n as usize),
                }
            });
            match peeked {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        },
    }
}
