//! A minimal protocol client for the CLI itself: connect to a server, shake
//! hands, make one call. Used by `cumux status` and by `cumux run` to check that
//! a server answers, and would let the program in, before starting it.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cumux_protocol::address::ServerAddress;
use cumux_protocol::stream::{ConnectError, Stream};
use cumux_protocol::{
    decode, encode, read_frame, refusal_text, write_frame, Call, ClientRole, DeviceInfo, Hello,
    HelloReply, Reply, ReplyBody, Request, ServerStatus, MAGIC, PROTOCOL_VERSION,
};
use cumux_server::Address;

/// A handshaken connection to a server.
pub struct Connection {
    stream: Stream,
    seq: u64,
    buf: Vec<u8>,
    pub session: u64,
    pub server: String,
    /// The devices the welcome described.
    pub devices: Vec<DeviceInfo>,
}

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ProbeError {
    /// Nothing listens at the address (or it cannot be reached).
    Unreachable(String),
    /// The server answered the hello with a refusal; the text says who was
    /// refused and keeps the server's reason verbatim.
    Refused(String),
    /// The connection could not be secured as the TLS settings ask.
    Insecure(String),
    /// The server answered, but not as a cumux server should.
    Broken(anyhow::Error),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Unreachable(why) | ProbeError::Refused(why) | ProbeError::Insecure(why) => {
                f.write_str(why)
            }
            ProbeError::Broken(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for ProbeError {}

/// Connects to `address` and introduces itself with `role`, as the tenant
/// `CUMUX_TENANT` names, if any.
pub fn connect(address: &Address, role: ClientRole, program: &str) -> Result<Connection> {
    Ok(connect_as(address, role, program, None)?)
}

/// Connects to `address` and introduces itself with `role`, as `tenant` (else
/// the tenant `CUMUX_TENANT` names, if any).
pub fn connect_as(
    address: &Address,
    role: ClientRole,
    program: &str,
    tenant: Option<&str>,
) -> Result<Connection, ProbeError> {
    connect_hello(address, role, program, tenant, std::process::id(), None)
}

/// Holds the devices `visible` (a `CUDA_VISIBLE_DEVICES` of this server's
/// devices) for the program `pid` that `cumux run --pool` placed there,
/// until the connection returned is dropped ([`ClientRole::Claim`]).
pub fn claim(
    address: &Address,
    tenant: Option<&str>,
    pid: u32,
    visible: &str,
) -> Result<Connection, ProbeError> {
    connect_hello(
        address,
        ClientRole::Claim,
        "cumux run --pool",
        tenant,
        pid,
        Some(visible.to_string()),
    )
}

fn connect_hello(
    address: &Address,
    role: ClientRole,
    program: &str,
    tenant: Option<&str>,
    pid: u32,
    visible_devices: Option<String>,
) -> Result<Connection, ProbeError> {
    let target = match address {
        Address::Unix(path) => ServerAddress::Unix(path.clone()),
        Address::Tcp(host_port) => ServerAddress::Tcp(host_port.clone()),
    };
    let stream = Stream::connect(&target).map_err(|e| match e {
        ConnectError::Unreachable(e) => {
            ProbeError::Unreachable(format!("no cumux server answers at {address}: {e}"))
        }
        ConnectError::Tls(why) => ProbeError::Insecure(why),
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| ProbeError::Broken(e.into()))?;
    let mut conn = Connection {
        stream,
        seq: 0,
        buf: Vec::new(),
        session: 0,
        server: String::new(),
        devices: Vec::new(),
    };
    let mut hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid,
        role,
        program: program.to_string(),
        // A status shows this tenant's sessions to a client that may be it.
        tenant: std::env::var("CUMUX_TENANT").ok(),
        token: std::env::var("CUMUX_TOKEN").ok(),
        shm: false,
        visible_devices,
        join: None,
        resume: None,
        lane: None,
    };
    if let Some(name) = tenant {
        hello.tenant = Some(name.to_string());
    }
    conn.send(&hello).map_err(ProbeError::Broken)?;
    match conn.receive::<HelloReply>().map_err(ProbeError::Broken)? {
        HelloReply::Welcome {
            server,
            session,
            devices,
            ..
        } => {
            conn.server = server;
            conn.session = session;
            conn.devices = devices;
            Ok(conn)
        }
        HelloReply::Rejected {
            server_version,
            reason,
        } => Err(ProbeError::Refused(refusal_text(
            &address.to_string(),
            server_version,
            hello.tenant.as_deref(),
            &reason,
        ))),
    }
}

impl Connection {
    fn send<T: serde::Serialize>(&mut self, msg: &T) -> Result<()> {
        let bytes = encode(msg).map_err(|e| anyhow!("encode: {e}"))?;
        write_frame(&mut self.stream, &bytes)?;
        Ok(())
    }

    fn receive<T: for<'a> serde::Deserialize<'a>>(&mut self) -> Result<T> {
        read_frame(&mut self.stream, &mut self.buf).context("the server closed the connection")?;
        decode(&self.buf).map_err(|e| anyhow!("undecodable answer from the server: {e}"))
    }

    /// A reply, with the bulk bytes a large `Data` answer (a checkpoint)
    /// sends in a frame of their own after it.
    fn receive_reply(&mut self) -> Result<Reply> {
        cumux_protocol::read_reply(&mut self.stream, &mut self.buf)
            .map_err(|e| anyhow!("the server's answer: {e}"))
    }

    /// Makes one replied call.
    pub fn call(&mut self, call: Call) -> Result<ReplyBody> {
        self.seq += 1;
        let seq = self.seq;
        self.send(&Request { seq, call })?;
        let reply = self.receive_reply()?;
        if reply.seq != seq {
            bail!("reply for call {} while waiting for {seq}", reply.seq);
        }
        reply.result.map_err(|e| anyhow!("{e}"))
    }

    /// Makes one replied call with the descriptor `fd` attached to its frame
    /// (`SCM_RIGHTS`: on a unix socket only).
    pub fn call_with_fd(&mut self, call: Call, fd: BorrowedFd<'_>) -> Result<ReplyBody> {
        let Stream::Unix(socket) = &self.stream else {
            bail!("a descriptor passes only over a unix socket");
        };
        self.seq += 1;
        let seq = self.seq;
        let payload = encode(&Request { seq, call }).map_err(|e| anyhow!("encode: {e}"))?;
        let mut frame = Vec::with_capacity(4 + payload.len());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&payload);
        cumux_protocol::shm::send_with_fd(socket, &frame, fd)
            .context("cannot send the call with its descriptor")?;
        let reply = self.receive_reply()?;
        if reply.seq != seq {
            bail!("reply for call {} while waiting for {seq}", reply.seq);
        }
        reply.result.map_err(|e| anyhow!("{e}"))
    }

    /// Asks for the server's status.
    pub fn status(&mut self) -> Result<ServerStatus> {
        match self.call(Call::ServerStatus)? {
            ReplyBody::Status(status) => Ok(status),
            other => bail!("unexpected answer to a status call: {other:?}"),
        }
    }
}
