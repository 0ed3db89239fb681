//! TLS on the server's TCP listener: the certificate and key it shows (PEM
//! files), optionally the CA whose client certificates it requires (mutual
//! TLS), and the handshake of one connection.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cumux_protocol::tls::{fingerprint, provider, read_certificates, read_key};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

use crate::locking::lock;

/// What a TCP listener shows its clients.
pub struct ServerTls {
    config: Arc<ServerConfig>,
    fingerprint: String,
}

/// The first byte of a TLS handshake record: how a TLS client is told from a
/// plain one, whose first bytes are a frame header.
pub const HANDSHAKE_RECORD: u8 = 0x16;

impl ServerTls {
    /// The certificate chain in `cert` and its key in `key` (PEM); with
    /// `client_ca`, every client must show a certificate that CA signed.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls, String> {
        let chain = read_certificates(cert)?;
        let key_path = key;
        let key = read_key(key_path)?;
        let fingerprint = fingerprint(chain[0].as_ref());
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for ca in read_certificates(path)? {
                    roots
                        .add(ca)
                        .map_err(|e| format!("{}: not a CA certificate: {e}", path.display()))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("{} and {}: {e}", cert.display(), key_path.display()))?;
        Ok(ServerTls {
            config: Arc::new(config),
            fingerprint,
        })
    }

    /// The rustls configuration (for the server's HTTP APIs too).
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// `sha256:…` of the certificate shown, which clients pin.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Runs the handshake on `tcp` (within `timeout`), whose peer sent a
    /// handshake record.
    pub fn accept(&self, tcp: TcpStream, timeout: Duration) -> Result<TlsStream, String> {
        let connection =
            ServerConnection::new(Arc::clone(&self.config)).map_err(|e| e.to_string())?;
        let mut stream = StreamOwned::new(connection, tcp);
        stream
            .sock
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .map_err(|e| format!("TLS handshake failed: {e}"))?;
        }
        let (mut connection, tcp) = stream.into_parts();
        // Large writes are encrypted in large steps, each a lock and a write.
        connection.set_buffer_limit(Some(WRITE_STEP));
        Ok(TlsStream {
            connection: Arc::new(Mutex::new(connection)),
            tcp: Arc::new(tcp),
            sending: Arc::new(Mutex::new(())),
            incoming: Vec::new(),
            taken: 0,
            outgoing: Vec::new(),
        })
    }
}

/// One TLS connection, read by one thread while another writes: the lock on
/// the connection's state is held only to decrypt or encrypt, never while the
/// socket blocks, so that a reader waiting for the next request never holds
/// back a reply.
pub struct TlsStream {
    connection: Arc<Mutex<ServerConnection>>,
    tcp: Arc<TcpStream>,
    /// Held from taking encrypted bytes out of the connection to writing them,
    /// so that records leave in the order they were made.
    sending: Arc<Mutex<()>>,
    /// Ciphertext read from the socket by this handle, from `taken` on not yet
    /// handed to the connection.
    incoming: Vec<u8>,
    taken: usize,
    /// This handle's buffer for encrypted bytes on their way out.
    outgoing: Vec<u8>,
}

/// Ciphertext read from the socket at once, at most.
const READ_AHEAD: usize = 256 << 10;

/// Plaintext encrypted at once, at most.
const WRITE_STEP: usize = 1 << 20;

fn tls_error(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, e)
}

impl Clone for TlsStream {
    /// Another handle on the same connection, with buffers of its own.
    fn clone(&self) -> Self {
        TlsStream {
            connection: Arc::clone(&self.connection),
            tcp: Arc::clone(&self.tcp),
            sending: Arc::clone(&self.sending),
            incoming: Vec::new(),
            taken: 0,
            outgoing: Vec::new(),
        }
    }
}

impl TlsStream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Writes what the connection has to send (records, alerts, key updates).
    fn send_pending(&mut self) -> std::io::Result<()> {
        let _order = lock(&self.sending);
        self.outgoing.clear();
        {
            let mut connection = lock(&self.connection);
            while connection.wants_write() {
                connection.write_tls(&mut self.outgoing)?;
            }
        }
        (&*self.tcp).write_all(&self.outgoing)
    }
}

impl Read for TlsStream {
    /// Gives the plaintext of every record whose ciphertext is here already
    /// (up to `buf`'s length), reading the socket only where there is none.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut given = 0;
        loop {
            let (got, wants_write) = {
                let mut connection = lock(&self.connection);
                // Hand over ciphertext until there is plaintext to give.
                while self.taken < self.incoming.len() && connection.wants_read() {
                    let mut rest = &self.incoming[self.taken..];
                    self.taken += connection.read_tls(&mut rest)?;
                    connection.process_new_packets().map_err(tls_error)?;
                }
                let got = match connection.reader().read(&mut buf[given..]) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => None,
                    got => Some(got),
                };
                (got, connection.wants_write())
            };
            if wants_write {
                self.send_pending()?;
            }
            match got {
                Some(Ok(n)) if n > 0 => {
                    given += n;
                    // Records already read decrypt into the rest of `buf`.
                    if given < buf.len() && self.taken < self.incoming.len() {
                        continue;
                    }
                    return Ok(given);
                }
                Some(_) | None if given > 0 => return Ok(given),
                Some(got) => return got,
                None => {}
            }
            if self.taken < self.incoming.len() {
                continue;
            }
            // More ciphertext, read without holding the connection.
            self.incoming.resize(READ_AHEAD, 0);
            self.taken = 0;
            let n = loop {
                match (&*self.tcp).read(&mut self.incoming) {
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.incoming.clear();
                        return Err(e);
                    }
                    Ok(n) => break n,
                }
            };
            self.incoming.truncate(n);
            if n == 0 {
                // The peer closed. Without TLS's close_notify first (clients
                // that exit don't send one) this is still an end: frames say
                // their length, so one cut short fails as a short read.
                let mut connection = lock(&self.connection);
                connection.read_tls(&mut &[][..])?;
                connection.process_new_packets().map_err(tls_error)?;
                return match connection.reader().read(&mut buf[given..]) {
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(0),
                    got => got,
                };
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Records leave in the order they were sealed: `send_pending` takes
        // them out, whoever seals the next, under the sending lock.
        let n = lock(&self.connection).writer().write(buf)?;
        self.send_pending()?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Every write leaves whole: nothing waits in a buffer.
        Ok(())
    }
}
