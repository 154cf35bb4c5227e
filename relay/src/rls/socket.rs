//! The RLS front's listener and its connections: TCP, or a Unix socket
//! (`--rls-listen unix:PATH`, envoyproxy/ratelimit's GRPC_UDS), served
//! with the same bounds.

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

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
                Ok(Socket::Tcp(stream))
            }
            Listener::Unix(l, _) => Ok(Socket::Unix(l.accept().await?.0)),
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

/// One connection of the front.
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    /// Its peer, for the log.
    pub fn peer(&self) -> String {
        match self {
            Socket::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into()),
            Socket::Unix(_) => "the Unix socket".into(),
        }
    }

    /// Reads without taking (MSG_PEEK), as `TcpStream::peek`.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.peek(buf).await,
            Socket::Unix(s) => loop {
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
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Socket::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Tcp(s) => s.is_write_vectored(),
            Socket::Unix(s) => s.is_write_vectored(),
        }
    }
}
