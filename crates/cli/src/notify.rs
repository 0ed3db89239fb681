//! Tells a service manager how the server stands, systemd's way (`sd_notify`):
//! one datagram of `KEY=value` lines to the unix socket `NOTIFY_SOCKET` names
//! (a path, or `@name` for the abstract namespace). Without it, nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable a service manager sets to the socket it listens on.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `state` (e.g. `READY=1\nSTATUS=…`) to `$NOTIFY_SOCKET`; `Ok(false)`
/// when no manager asked for it.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET).filter(|t| !t.is_empty()) else {
        return Ok(false);
    };
    send_to(&target.to_string_lossy(), state)?;
    Ok(true)
}

/// Sends `state` as one datagram to `target`: a socket path, or `@name`.
pub fn send_to(target: &str, state: &str) -> io::Result<()> {
    let address = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &address)?;
    Ok(())
}

/// [`notify`], with a failure logged rather than returned: the server serves
/// whether or not its manager hears.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("cannot notify the service manager ({NOTIFY_SOCKET}): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_or_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        send_to(path.to_str().unwrap(), "READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
        let name = format!("cumux-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&address).unwrap();
        send_to(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        assert!(send_to(dir.path().join("none").to_str().unwrap(), "READY=1").is_err());
    }
}
