//! The connection to the cumux server: the handshake, then requests and
//! replies over a unix socket. A failed read or write marks the connection
//! dead, and every later call fails fast with `CUDA_ERROR_DEVICE_UNAVAILABLE`.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use cumux_protocol::{
    self as proto, Call, ClientRole, DeviceInfo, Hello, HelloReply, Reply, ReplyBody, Request,
};

use crate::errors::*;

/// Where the server listens: `CUMUX_SERVER=unix:PATH`, else the per-user default.
pub fn server_path() -> Result<PathBuf, String> {
    if let Ok(addr) = std::env::var("CUMUX_SERVER") {
        return match addr.strip_prefix("unix:") {
            Some(p) => Ok(PathBuf::from(p)),
            None if addr.starts_with('/') => Ok(PathBuf::from(addr)),
            None => Err(format!("CUMUX_SERVER={addr}: only unix:PATH is supported")),
        };
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Ok(PathBuf::from(dir).join("cumux").join("cumux.sock"));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Ok(PathBuf::from(format!("/tmp/cumux-{uid}/cumux.sock")))
}

/// Writes to the socket with `MSG_NOSIGNAL`: a server that went away must
/// turn into an error, not a SIGPIPE that kills the program.
struct NoSigPipe<'a>(&'a UnixStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // SAFETY: sending from an initialised buffer of the given length on
        // a socket this connection owns.
        let n = unsafe {
            libc::send(
                self.0.as_raw_fd(),
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
    stream: UnixStream,
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
        let path = server_path()?;
        let stream = UnixStream::connect(&path)
            .map_err(|e| format!("cannot reach the cumux server at {}: {e}", path.display()))?;
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
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
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

/// Device `printf` output goes to the program's own fd 1, unbuffered.
fn write_program_stdout(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let _ = std::io::stdout().flush();
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: writing an initialised buffer of the given length to fd 1.
        let n = unsafe { libc::write(1, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}
