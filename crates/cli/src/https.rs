//! HTTPS for the server's HTTP APIs: a listener for `axum::serve` whose
//! connections are TLS (the server's certificate, ALPN h2 and http/1.1), each
//! handshake in a task of its own so a slow client holds up no other.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY: usize = 64;

/// Connections that finished their TLS handshake, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` (inside a tokio runtime) with `config`, whose
    /// ALPN this sets to h2 and http/1.1.
    pub fn new(listener: TcpListener, config: &rustls::ServerConfig) -> io::Result<TlsListener> {
        let mut config = config.clone();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let local = listener.local_addr()?;
        let (send, ready) = mpsc::channel(READY);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("https: cannot accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Answers go out whole, never held back for more.
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(%peer, "https: cannot set TCP_NODELAY: {e}");
                }
                let (acceptor, send) = (acceptor.clone(), send.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = send.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "https: TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "https: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task ended with the runtime: nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
