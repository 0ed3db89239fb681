//! What a tenant's NVML shows, asked of the cumux server: the devices a
//! driver of this tenant would get (a preflight hello), and its own memory
//! processes and utilization on each (a status scoped to the tenant).

use std::time::Duration;

use cumux_protocol::address::server_address;
use cumux_protocol::stream::{ConnectError, Stream};
use cumux_protocol::{
    decode, encode, read_frame, write_frame, Call, ClientRole, DeviceInfo, Hello, HelloReply,
    Reply, ReplyBody, Request, ServerStatus, MAGIC, PROTOCOL_VERSION,
};

/// How long a question to the server may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The tenant's use of one device now.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub used: u64,
    /// Its processes there: (pid, bytes, program).
    pub processes: Vec<(u32, u64, String)>,
    /// Percent of the last second the device ran its work; `None` where the
    /// server does not time that work.
    pub gpu_percent: Option<u32>,
    /// Whether every session on the device is the tenant's (so the whole
    /// device's figures are its own).
    pub sole: bool,
}

/// A connection that said hello as `role`, with the server's answer.
fn hello(role: ClientRole) -> Result<(Stream, HelloReply), String> {
    let address = server_address()?;
    let mut stream = Stream::connect(&address).map_err(|e| match e {
        ConnectError::Unreachable(e) => format!("no cumux server answers at {address}: {e}"),
        ConnectError::Tls(why) => why,
    })?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role,
        program: std::env::args()
            .next()
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect(),
        tenant: std::env::var("CUMUX_TENANT").ok(),
        token: std::env::var("CUMUX_TOKEN").ok(),
        shm: false,
        visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        join: None,
        resume: None,
        lane: None,
    };
    let reply: HelloReply = exchange(&mut stream, &hello)?;
    Ok((stream, reply))
}

fn exchange<T: serde::Serialize, R: serde::de::DeserializeOwned>(
    stream: &mut Stream,
    message: &T,
) -> Result<R, String> {
    let bytes = encode(message).map_err(|e| e.to_string())?;
    write_frame(stream, &bytes).map_err(|e| format!("the cumux server went away: {e}"))?;
    let mut buf = Vec::new();
    read_frame(stream, &mut buf).map_err(|e| format!("the cumux server went away: {e}"))?;
    decode(&buf).map_err(|e| format!("a malformed answer from the cumux server: {e}"))
}

fn welcome(reply: HelloReply) -> Result<Vec<DeviceInfo>, String> {
    match reply {
        HelloReply::Welcome { devices, .. } => Ok(devices),
        HelloReply::Rejected { reason, .. } => Err(format!("the cumux server refused: {reason}")),
    }
}

/// The server's status, as this tenant may see it.
fn status() -> Result<ServerStatus, String> {
    let (mut stream, reply) = hello(ClientRole::Status)?;
    welcome(reply)?;
    let request = Request {
        seq: 1,
        call: Call::ServerStatus,
    };
    match exchange::<_, Reply>(&mut stream, &request)?.result {
        Ok(ReplyBody::Status(status)) => Ok(status),
        Ok(other) => Err(format!(
            "an unexpected answer from the cumux server: {other:?}"
        )),
        Err(e) => Err(format!("the cumux server refused the status: {}", e.detail)),
    }
}

/// Which tenant the status is about: the one it is scoped to, else (a status
/// that shows every tenant, to the server's own user) the one this process
/// names (`CUMUX_TENANT`), else the server's default one.
fn own_tenant(status: &ServerStatus) -> String {
    match status.shown.strip_prefix("tenant ") {
        Some(name) => name.to_string(),
        None => std::env::var("CUMUX_TENANT").unwrap_or_else(|_| DEFAULT_TENANT.into()),
    }
}

/// The tenant a server without a tenant table gives a client that names none.
const DEFAULT_TENANT: &str = "default";

/// The tenant's devices, in the order its programs see them, each with the
/// memory it may use there (its quota, at most the device's).
pub fn devices() -> Result<Vec<DeviceInfo>, String> {
    let (_, reply) = hello(ClientRole::Preflight)?;
    welcome(reply)
}

/// The tenant's use of the device whose UUID is `uuid` now.
pub fn usage(uuid: &[u8; 16]) -> Result<Usage, String> {
    let status = status()?;
    let own = own_tenant(&status);
    let Some(device) = status.devices.iter().find(|d| &d.uuid == uuid) else {
        return Err("the cumux server no longer has this device".into());
    };
    let mut usage = Usage {
        gpu_percent: Some(0),
        ..Usage::default()
    };
    if let Some(u) = status
        .utilization
        .iter()
        .find(|u| u.device == device.ordinal && u.tenant == own)
    {
        usage.gpu_percent = u.gpu_percent;
    }
    let mut own_sessions: u32 = 0;
    for s in status
        .sessions
        .iter()
        .filter(|s| s.device == device.ordinal && s.tenant == own)
    {
        own_sessions += 1;
        usage.used += s.mem_used;
        usage.processes.push((s.pid, s.mem_used, s.program.clone()));
    }
    usage.sole = device.sessions == own_sessions;
    Ok(usage)
}
