//! TLS on the server's TCP listener: the certificate and key it shows (PEM
//! files), optionally the CA whose client certificates it requires (mutual
//! TLS), and the handshake of one connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cumux_protocol::tls::{fingerprint, provider, read_certificates, read_key};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

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
        let tcp = stream.sock.try_clone().map_err(|e| e.to_string())?;
        Ok(TlsStream {
            stream: Arc::new(Mutex::new(stream)),
            tcp: Arc::new(tcp),
        })
    }
}

/// A TLS connection, shared by the reading and the writing half of the one
/// thread that serves it (reads and writes never overlap).
#[derive(Clone)]
pub struct TlsStream {
    stream: Arc<Mutex<StreamOwned<ServerConnection, TcpStream>>>,
    /// The same socket (a second descriptor): its options, its hang-ups.
    tcp: Arc<TcpStream>,
}

impl TlsStream {
    fn lock(&self) -> MutexGuard<'_, StreamOwned<ServerConnection, TcpStream>> {
        self.stream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.lock().read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.lock().flush()
    }
}
