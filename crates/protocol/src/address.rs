//! Where a cumux server listens, as its clients find it: `CUMUX_SERVER`
//! (`unix:PATH` or `tcp:HOST:PORT`; several, comma-separated, for a program
//! that uses the devices of several servers), else the per-user socket.

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

/// One address as `CUMUX_SERVER` writes it.
pub fn parse(addr: &str) -> Result<ServerAddress, String> {
    let addr = addr.trim();
    if let Some(p) = addr.strip_prefix("unix:") {
        return Ok(ServerAddress::Unix(PathBuf::from(p)));
    }
    if let Some(a) = addr.strip_prefix("tcp:") {
        return Ok(ServerAddress::Tcp(a.to_string()));
    }
    if addr.starts_with('/') {
        return Ok(ServerAddress::Unix(PathBuf::from(addr)));
    }
    Err(format!(
        "CUMUX_SERVER={addr}: expected unix:PATH or tcp:HOST:PORT"
    ))
}

/// Every server `CUMUX_SERVER` lists (comma-separated), in its order, else
/// the per-user socket.
pub fn server_addresses() -> Result<Vec<ServerAddress>, String> {
    match std::env::var("CUMUX_SERVER") {
        Ok(list) => {
            let addresses = list.split(',').map(parse).collect::<Result<Vec<_>, _>>()?;
            for (i, a) in addresses.iter().enumerate() {
                if addresses[..i].contains(a) {
                    return Err(format!("CUMUX_SERVER lists {a} twice"));
                }
            }
            Ok(addresses)
        }
        Err(_) => server_address().map(|a| vec![a]),
    }
}

/// `CUMUX_SERVER` (`unix:PATH` or `tcp:HOST:PORT`; the first, if it lists
/// several), else the per-user socket.
pub fn server_address() -> Result<ServerAddress, String> {
    if let Ok(list) = std::env::var("CUMUX_SERVER") {
        return parse(list.split(',').next().unwrap_or_default());
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
