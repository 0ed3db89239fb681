//! A client's connection to a server: a unix socket, plain TCP or TLS over
//! TCP (as `CUMUX_TLS_*` ask), with TCP keep-alive so that a dead peer turns
//! into an error within seconds, and writes that never raise SIGPIPE.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::address::ServerAddress;
use crate::tls;

/// How long a TCP peer may stay silent with data unacknowledged, or with the
/// connection idle and its keep-alive probes unanswered, before it is dead.
pub const DEAD_PEER: Duration = Duration::from_secs(5);

/// A connected socket, on either transport.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, Tcp>>),
}

/// A TCP stream whose writes never raise SIGPIPE (under TLS too).
pub struct Tcp(pub TcpStream);

impl Read for Tcp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Tcp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send_nosignal(self.0.as_raw_fd(), buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `send` with `MSG_NOSIGNAL`: a peer that went away is an error, not a
/// SIGPIPE that kills the program the driver lives in.
fn send_nosignal(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: sending from an initialised buffer of the given length on a
    // socket the caller owns for the call.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Whether every address `host_port` names is a loopback one.
pub fn loopback_only(host_port: &str) -> io::Result<bool> {
    let addresses: Vec<_> = host_port.to_socket_addrs()?.collect();
    Ok(!addresses.is_empty() && addresses.iter().all(|a| a.ip().is_loopback()))
}

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing answers at the address.
    Unreachable(io::Error),
    /// The TLS settings or handshake, or plain TCP to another host: the
    /// text says what to do.
    Tls(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Unreachable(e) => e.fmt(f),
            ConnectError::Tls(why) => f.write_str(why),
        }
    }
}

impl Stream {
    /// Connects to `address`; over TCP with TLS when `CUMUX_TLS_FINGERPRINT`
    /// or `CUMUX_TLS_CA` is set. Plain TCP to another host needs
    /// `CUMUX_INSECURE=1`. Errors say what to do.
    pub fn connect(address: &ServerAddress) -> Result<Stream, ConnectError> {
        let unreachable = ConnectError::Unreachable;
        match address {
            ServerAddress::Unix(path) => Ok(Stream::Unix(
                UnixStream::connect(path).map_err(unreachable)?,
            )),
            ServerAddress::Tcp(host_port) => {
                let tls = tls::client_config_from_env().map_err(ConnectError::Tls)?;
                if tls.is_none()
                    && !insecure_allowed()
                    && !loopback_only(host_port).unwrap_or(false)
                {
                    return Err(ConnectError::Tls(format!(
                        "{address} is another host and the connection would be plain TCP: set {} \
                         (the fingerprint `cumux serve` prints) or {} to use TLS, or {}=1 to \
                         send tokens and data in the clear",
                        tls::FINGERPRINT_VAR,
                        tls::CA_VAR,
                        tls::INSECURE_VAR
                    )));
                }
                let tcp = TcpStream::connect(host_port.as_str()).map_err(unreachable)?;
                // Calls are small and latency-bound.
                tcp.set_nodelay(true).map_err(unreachable)?;
                keep_alive(&tcp).map_err(unreachable)?;
                match tls {
                    None => Ok(Stream::Tcp(tcp)),
                    Some(config) => Stream::handshake(address, host_port, tcp, config)
                        .map_err(ConnectError::Tls),
                }
            }
        }
    }

    /// TLS over `tcp`, the handshake done now so that its failure is the
    /// connect's and says why.
    fn handshake(
        address: &ServerAddress,
        host_port: &str,
        tcp: TcpStream,
        config: Arc<ClientConfig>,
    ) -> Result<Stream, String> {
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_string())
                .map_err(|e| format!("{address}: {host:?} is not a host name: {e}"))?,
        };
        let connection =
            ClientConnection::new(config, name).map_err(|e| format!("TLS with {address}: {e}"))?;
        let mut stream = StreamOwned::new(connection, Tcp(tcp));
        // The handshake may not wait for ever on a server that says nothing.
        let _ = stream.sock.0.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        while stream.conn.is_handshaking() {
            if let Err(e) = stream.conn.complete_io(&mut stream.sock) {
                return Err(handshake_error(address, e));
            }
        }
        let _ = stream.sock.0.set_read_timeout(None);
        Ok(Stream::Tls(Box::new(stream)))
    }

    /// The TCP or unix socket underneath.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
            Stream::Tls(s) => s.sock.0.as_fd(),
        }
    }

    /// The unix socket, where the connection is one (descriptors travel there).
    pub fn unix(&self) -> Option<&UnixStream> {
        match self {
            Stream::Unix(s) => Some(s),
            _ => None,
        }
    }

    /// How long a read may wait (`None`: for ever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Tls(s) => s.sock.0.set_read_timeout(timeout),
        }
    }

    /// Closes both directions (the server sees the hang-up at once).
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tls(s) => s.sock.0.shutdown(std::net::Shutdown::Both),
        };
    }

    /// `tls`, `tcp` or `unix`, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Stream::Unix(_) => "unix",
            Stream::Tcp(_) => "tcp",
            Stream::Tls(_) => "tls",
        }
    }
}

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn insecure_allowed() -> bool {
    std::env::var(tls::INSECURE_VAR).is_ok_and(|v| v.trim() == "1")
}

/// What a failed handshake means for the user.
fn handshake_error(address: &ServerAddress, e: io::Error) -> String {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    if let Some(why) = tls.and_then(certificate_text) {
        return format!("TLS handshake with the cumux server at {address} failed: {why}");
    }
    let hint = match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
            " (the server closed the connection: does it listen with TLS? A plain server \
             takes clients without CUMUX_TLS_FINGERPRINT and CUMUX_TLS_CA)"
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            " (no answer: is this a cumux server?)"
        }
        _ => "",
    };
    format!("TLS handshake with the cumux server at {address} failed: {e}{hint}")
}

/// A rejected server certificate, in words.
fn certificate_text(e: &rustls::Error) -> Option<String> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(why) = e else {
        return None;
    };
    Some(match why {
        C::Expired | C::ExpiredContext { .. } => "the server's certificate has expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet".into()
        }
        C::UnknownIssuer | C::BadSignature => format!(
            "the server's certificate was not issued by a CA that {} trusts",
            tls::CA_VAR
        ),
        C::NotValidForName | C::NotValidForNameContext { .. } => format!(
            "the server's certificate does not name this address (a CA-issued certificate \
             must; or pin it with {})",
            tls::FINGERPRINT_VAR
        ),
        other => format!("the server's certificate was refused: {other:?}"),
    })
}

/// Probes an idle connection after 1 s, every second, 4 times, and gives up
/// on unacknowledged data after [`DEAD_PEER`].
pub fn keep_alive(tcp: &TcpStream) -> io::Result<()> {
    let fd = tcp.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| -> io::Result<()> {
        // SAFETY: setting an integer option on a socket the caller owns; the
        // pointer and length describe `value`, alive for the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 4)?;
    set(
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        DEAD_PEER.as_millis() as libc::c_int,
    )
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => send_nosignal(s.as_raw_fd(), buf),
            Stream::Tcp(s) => send_nosignal(s.as_raw_fd(), buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}
