//! Where a cumux server listens, as its clients find it: `CUMUX_SERVER`
//! (`unix:PATH` or `tcp:HOST:PORT`), else the per-user socket.

use std::path::PathBuf;

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
