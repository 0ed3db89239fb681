//! The connection to the cumux server: the handshake, then requests and
//! replies over a unix socket or TCP. A failed read or write marks the
//! connection dead, and every later call fails fast with
//! `CUDA_ERROR_DEVICE_UNAVAILABLE`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use cumux_protocol::{
    self as proto, Call, ClientRole, DeviceInfo, Hello, HelloReply, Reply, ReplyBody, Request,
};

use crate::errors::*;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddress {
    Unix(PathBuf),
    /// `HOST:PORT`.
    Tcp(String),
}

impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddress::Unix(p) => write!(f, "unix:{}", p.display()),
            ServerAddress::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// `CUMUX_SERVER` (`unix:PATH` or `tcp:HOST:PORT`), else the per-user socket.
pub fn server_address() -> Result<ServerAddress, String> {
    if let Ok(addr) = std::env::var("CUMUX_SERVER") {
        if let Some(p) = addr.strip_prefix("unix:") {
            return Ok(ServerAddress::Unix(PathBuf::from(p)));
        }
        if let Some(a) = addr.strip_prefix("tcp:") {
            return Ok(ServerAddress::Tcp(a.to_string()));
        }
        if addr.starts_with('/') {
            return Ok(ServerAddress::Unix(PathBuf::from(addr)));
        }
        return Err(format!(
            "CUMUX_SERVER={addr}: expected unix:PATH or tcp:HOST:PORT"
        ));
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Ok(ServerAddress::Unix(
            PathBuf::from(dir).join("cumux").join("cumux.sock"),
        ));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Ok(ServerAddress::Unix(PathBuf::from(format!(
        "/tmp/cumux-{uid}/cumux.sock"
    ))))
}

/// The socket under a connection.
enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    fn connect(addr: &ServerAddress) -> std::io::Result<Socket> {
        Ok(match addr {
            ServerAddress::Unix(p) => Socket::Unix(UnixStream::connect(p)?),
            ServerAddress::Tcp(a) => {
                let s = TcpStream::connect(a.as_str())?;
                // Calls are small and latency-bound.
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
        })
    }

    fn fd(&self) -> RawFd {
        match self {
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tcp(s) => s.as_raw_fd(),
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(s) => s.read(buf),
            Socket::Tcp(s) => s.read(buf),
        }
    }
}

/// Writes to the socket with `MSG_NOSIGNAL`: a server that went away must
/// turn into an error, not a SIGPIPE that kills the program.
struct NoSigPipe<'a>(&'a Socket);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // SAFETY: sending from an initialised buffer of the given length on
        // a socket this connection owns.
        let n = unsafe {
            libc::send(
                self.0.fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub struct Connection {
    stream: Socket,
    seq: u64,
    buf: Vec<u8>,
    dead: bool,
}

/// What the server said at connect.
pub struct Session {
    pub server: String,
    pub session: u64,
    pub devices: Vec<DeviceInfo>,
}

impl Connection {
    pub fn connect() -> Result<(Connection, Session), String> {
        let address = server_address()?;
        let stream = Socket::connect(&address)
            .map_err(|e| format!("cannot reach the cumux server at {address}: {e}"))?;
        let mut conn = Connection {
            stream,
            seq: 0,
            buf: Vec::new(),
            dead: false,
        };
        let program = std::env::args().next().unwrap_or_default();
        let hello = Hello {
            magic: proto::MAGIC,
            version: proto::PROTOCOL_VERSION,
            pid: std::process::id(),
            role: ClientRole::Driver,
            program,
            tenant: std::env::var("CUMUX_TENANT").ok(),
        };
        let bytes = proto::encode(&hello).map_err(|e| e.to_string())?;
        proto::write_frame(&mut NoSigPipe(&conn.stream), &bytes)
            .map_err(|e| format!("handshake: {e}"))?;
        proto::read_frame(&mut conn.stream, &mut conn.buf)
            .map_err(|e| format!("handshake: {e}"))?;
        match proto::decode::<HelloReply>(&conn.buf).map_err(|e| format!("handshake: {e}"))? {
            HelloReply::Welcome {
                version,
                server,
                session,
                devices,
            } => {
                if version != proto::PROTOCOL_VERSION {
                    return Err(format!(
                        "protocol version mismatch: client {}, server {version}",
                        proto::PROTOCOL_VERSION
                    ));
                }
                Ok((
                    conn,
                    Session {
                        server,
                        session,
                        devices,
                    },
                ))
            }
            HelloReply::Rejected {
                server_version,
                reason,
            } => Err(format!(
                "server (protocol {server_version}) rejected client (protocol {}): {reason}",
                proto::PROTOCOL_VERSION
            )),
        }
    }

    fn lost(&mut self, why: impl std::fmt::Display) -> CUresult {
        if !self.dead {
            tracing::error!("connection to the cumux server lost: {why}");
        }
        self.dead = true;
        self.stream.shutdown();
        CUDA_ERROR_DEVICE_UNAVAILABLE
    }

    /// Sends a call; waits for its reply unless it is fire-and-forget (then
    /// `Unit` comes back at once).
    pub fn call(&mut self, call: Call) -> CuResult<ReplyBody> {
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        let forget = call.is_fire_and_forget();
        self.seq += 1;
        let seq = self.seq;
        let bytes = proto::encode(&Request { seq, call }).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if let Err(e) = proto::write_frame(&mut NoSigPipe(&self.stream), &bytes) {
            return Err(self.lost(e));
        }
        if forget {
            return Ok(ReplyBody::Unit);
        }
        loop {
            if let Err(e) = proto::read_frame(&mut self.stream, &mut self.buf) {
                return Err(self.lost(e));
            }
            let reply: Reply = match proto::decode(&self.buf) {
                Ok(r) => r,
                Err(e) => return Err(self.lost(format!("malformed reply: {e}"))),
            };
            write_program_stdout(&reply.stdout);
            if reply.seq != seq {
                tracing::warn!(
                    "reply for call {} while waiting for {seq}; skipped",
                    reply.seq
                );
                continue;
            }
            return reply.result.map_err(|e| {
                tracing::debug!("server: {e}");
                if e.code == 0 {
                    CUDA_ERROR_UNKNOWN
                } else {
                    e.code
                }
            });
        }
    }
}

extern "C" {
    /// The C library's `stdout` stream of the program.
    static mut stdout: *mut libc::FILE;
}

/// Device `printf` output goes to the program's own standard output through
/// its C `stdout` stream (so it lands after what the program printed before
/// the kernel, as with NVIDIA's driver), flushed at once.
fn write_program_stdout(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let _ = std::io::stdout().flush();
    // SAFETY: reading the C library's `stdout` pointer, which it initialises
    // before any program code runs; fwrite/fflush lock the stream themselves.
    unsafe {
        let out = stdout;
        if out.is_null() {
            return;
        }
        libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), out);
        libc::fflush(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A one-connection fake server: answers the hello with `reply`, then
    /// answers `calls` requests with `Unit` and hangs up.
    fn fake_server(
        path: &std::path::Path,
        reply: HelloReply,
        calls: usize,
    ) -> std::thread::JoinHandle<()> {
        let listener = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            proto::read_frame(&mut s, &mut buf).unwrap();
            let hello: Hello = proto::decode(&buf).unwrap();
            assert_eq!(hello.magic, proto::MAGIC);
            proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
            for _ in 0..calls {
                proto::read_frame(&mut s, &mut buf).unwrap();
                let req: Request = proto::decode(&buf).unwrap();
                let reply = Reply {
                    seq: req.seq,
                    result: Ok(ReplyBody::Unit),
                    stdout: Vec::new(),
                };
                proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
            }
        })
    }

    fn welcome(version: u32) -> HelloReply {
        HelloReply::Welcome {
            version,
            server: "fake".into(),
            session: 1,
            devices: Vec::new(),
        }
    }

    /// One test drives the three cases in turn: `CUMUX_SERVER` is process-wide.
    #[test]
    fn handshake_versions_and_a_lost_connection() {
        let dir =
            std::env::temp_dir().join(format!("cumux-client-transport-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        std::env::set_var("CUMUX_SERVER", format!("unix:{}", sock.display()));

        // Nobody listening.
        let err = Connection::connect().err().unwrap();
        assert!(err.contains("cannot reach the cumux server"), "{err}");

        // A rejection names both versions.
        let server = fake_server(
            &sock,
            HelloReply::Rejected {
                server_version: 99,
                reason: "too old".into(),
            },
            0,
        );
        let err = Connection::connect().err().unwrap();
        assert!(
            err.contains("99") && err.contains(&proto::PROTOCOL_VERSION.to_string()),
            "{err}"
        );
        server.join().unwrap();
        std::fs::remove_file(&sock).unwrap();

        // A server of another version, even one that says welcome.
        let server = fake_server(&sock, welcome(proto::PROTOCOL_VERSION + 1), 0);
        let err = Connection::connect().err().unwrap();
        assert!(err.contains("mismatch"), "{err}");
        server.join().unwrap();
        std::fs::remove_file(&sock).unwrap();

        // One answered call, then the server goes away: every later call
        // fails at once.
        let server = fake_server(&sock, welcome(proto::PROTOCOL_VERSION), 1);
        let (mut conn, session) = Connection::connect().unwrap();
        assert_eq!(session.server, "fake");
        assert_eq!(conn.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
        server.join().unwrap();
        assert_eq!(
            conn.call(Call::ContextSynchronize),
            Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
        );
        assert_eq!(
            conn.call(Call::MemGetInfo { device: 0 }),
            Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
