//! One client connection on the wire: the version handshake, then a loop of
//! framed requests and replies over a session. Malformed bytes close the
//! connection (and its session) and never reach anything else.

use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cumux_protocol::{
    codes, decode, encode, read_frame, write_frame, ClientRole, CuError, FrameError, Hello,
    HelloReply, Reply, Request, MAGIC, PROTOCOL_VERSION,
};

use crate::session::Session;
use crate::Server;

/// Why a connection ended, for the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The client closed it.
    Closed,
    /// The client was turned away at the handshake.
    Rejected(String),
    /// The client sent something that is not the protocol, or the link broke.
    Broken(String),
}

/// Serves one connection until it ends; the session's resources are all
/// released before this returns. `peer_uid` is the uid of the process at the
/// other end, where the transport can tell (unix sockets).
pub fn serve_connection<W: Write>(
    server: Arc<Server>,
    peer_uid: Option<u32>,
    mut reader: impl Read,
    mut writer: W,
    welcomed: impl FnOnce(&mut W),
) -> Ending {
    let mut buf = Vec::new();
    let hello = match read_hello(&mut reader, &mut buf) {
        Ok(hello) => hello,
        Err(Handshake::Broken(why)) => return Ending::Broken(why),
        Err(Handshake::Reject(reason)) => {
            let _ = send(&mut writer, &reject(reason.clone()));
            return Ending::Rejected(reason);
        }
    };
    let tenant = match hello.role {
        ClientRole::Status => None,
        ClientRole::Driver => match server.tenants().admit(hello.tenant.as_deref(), peer_uid) {
            Ok(tenant) => Some(tenant),
            Err(reason) => {
                tracing::warn!(pid = hello.pid, ?peer_uid, "connection refused: {reason}");
                let _ = send(&mut writer, &reject(reason.clone()));
                return Ending::Rejected(reason);
            }
        },
    };
    let devices = match &tenant {
        Some((_, settings)) => server
            .devices_for(settings)
            .into_iter()
            .map(|(_, info)| info)
            .collect(),
        None => server.device_infos(),
    };
    let tenant_name = tenant.as_ref().map(|t| t.0.clone());
    let mut session = match Session::open(Arc::clone(&server), &hello, tenant) {
        Ok(session) => session,
        Err(e) => {
            let _ = send(&mut writer, &reject(e.to_string()));
            return Ending::Rejected(e.to_string());
        }
    };
    let welcome = HelloReply::Welcome {
        version: PROTOCOL_VERSION,
        server: server.name().to_string(),
        session: session.id(),
        devices,
    };
    tracing::info!(
        session = session.id(),
        pid = hello.pid,
        program = %hello.program,
        tenant = tenant_name.as_deref().unwrap_or("-"),
        ?peer_uid,
        role = ?hello.role,
        "session opened"
    );
    welcomed(&mut writer);
    let ending = match send(&mut writer, &welcome) {
        Ok(()) => request_loop(&mut session, &mut reader, &mut writer, &mut buf),
        Err(e) => Ending::Broken(e),
    };
    let id = session.id();
    let (launches, gpu_ms) = session.totals();
    if catch_unwind(AssertUnwindSafe(|| session.close())).is_err() {
        tracing::error!(session = id, "session clean-up panicked");
    }
    match &ending {
        Ending::Broken(why) => {
            tracing::warn!(session = id, launches, gpu_ms, "connection dropped: {why}")
        }
        _ => tracing::info!(session = id, launches, gpu_ms, "session closed"),
    }
    ending
}

fn request_loop(
    session: &mut Session,
    reader: &mut impl Read,
    writer: &mut impl Write,
    buf: &mut Vec<u8>,
) -> Ending {
    loop {
        match read_frame(reader, buf) {
            Ok(()) => {}
            Err(FrameError::Closed) => return Ending::Closed,
            Err(e) => return Ending::Broken(format!("bad frame: {e}")),
        }
        let request: Request = match decode(buf) {
            Ok(r) => r,
            Err(e) => {
                return Ending::Broken(format!("undecodable request ({} bytes): {e}", buf.len()))
            }
        };
        let seq = request.seq;
        tracing::trace!(session = session.id(), seq, "call");
        let result = match catch_unwind(AssertUnwindSafe(|| session.handle(request.call))) {
            Ok(result) => result,
            Err(_) => {
                tracing::error!(
                    session = session.id(),
                    seq,
                    "a call panicked; closing the session"
                );
                let reply = Reply {
                    seq,
                    result: Err(CuError::new(codes::UNKNOWN, "internal server error")),
                    stdout: Vec::new(),
                };
                let _ = send(writer, &reply);
                return Ending::Broken("a call panicked".into());
            }
        };
        if let Some(result) = result {
            let reply = Reply {
                seq,
                result,
                stdout: session.take_stdout(),
            };
            if let Err(e) = send(writer, &reply) {
                return Ending::Broken(e);
            }
        }
    }
}

enum Handshake {
    Broken(String),
    Reject(String),
}

fn read_hello(reader: &mut impl Read, buf: &mut Vec<u8>) -> Result<Hello, Handshake> {
    read_frame(reader, buf).map_err(|e| Handshake::Broken(format!("no hello: {e}")))?;
    // Magic and version lead every hello of every version: read them first, so a
    // client of another version is told so even if the rest has changed shape.
    let (magic, version): (u32, u32) =
        decode(buf).map_err(|e| Handshake::Broken(format!("undecodable hello: {e}")))?;
    if magic != MAGIC {
        return Err(Handshake::Reject(format!(
            "bad magic {magic:#x} (expected {MAGIC:#x}): not a cumux client of protocol version {PROTOCOL_VERSION}"
        )));
    }
    if version != PROTOCOL_VERSION {
        return Err(Handshake::Reject(format!(
            "protocol version mismatch: the client speaks version {version}, this server speaks version {PROTOCOL_VERSION}"
        )));
    }
    decode(buf).map_err(|e| {
        Handshake::Reject(format!(
            "malformed hello for protocol version {PROTOCOL_VERSION}: {e}"
        ))
    })
}

fn reject(reason: String) -> HelloReply {
    HelloReply::Rejected {
        server_version: PROTOCOL_VERSION,
        reason,
    }
}

fn send<T: serde::Serialize>(writer: &mut impl Write, msg: &T) -> Result<(), String> {
    let bytes = encode(msg).map_err(|e| format!("cannot encode a reply: {e}"))?;
    write_frame(writer, &bytes).map_err(|e| format!("cannot send: {e}"))?;
    writer.flush().map_err(|e| format!("cannot send: {e}"))
}
