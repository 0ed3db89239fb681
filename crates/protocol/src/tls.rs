//! TLS on TCP connections, the client's side: which server certificates it
//! trusts (a pinned SHA-256 fingerprint, or a CA), its own certificate for
//! mutual TLS, all from `CUMUX_TLS_*`; and the fingerprint format both sides print.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use sha2::{Digest, Sha256};

/// Pinned server fingerprints, comma-separated (`sha256:AB:CD:…`).
pub const FINGERPRINT_VAR: &str = "CUMUX_TLS_FINGERPRINT";
/// A PEM file of CA certificates to trust for the server's.
pub const CA_VAR: &str = "CUMUX_TLS_CA";
/// The client's own certificate chain and key (PEM), for mutual TLS.
pub const CERT_VAR: &str = "CUMUX_TLS_CERT";
pub const KEY_VAR: &str = "CUMUX_TLS_KEY";
/// `1` lets plain TCP reach a server on another host.
pub const INSECURE_VAR: &str = "CUMUX_INSECURE";

/// The crypto both sides use: ring's, with AES-128-GCM first (ring lists
/// AES-256-GCM first; the 128-bit key is as safe for this use and its
/// rounds are fewer, and every byte of a copy goes through it twice).
pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| {
        !matches!(
            suite.suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
                | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(provider)
}

/// `sha256:AB:CD:…` of a certificate (its DER bytes).
pub fn fingerprint(der: &[u8]) -> String {
    let hex: Vec<String> = Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    format!("sha256:{}", hex.join(":"))
}

/// Reads a fingerprint as [`fingerprint`] writes it; the `sha256:` prefix,
/// the colons and the case are optional.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], String> {
    let t = text.trim();
    let hex: String = t
        .strip_prefix("sha256:")
        .or_else(|| t.strip_prefix("SHA256:"))
        .unwrap_or(t)
        .chars()
        .filter(|c| *c != ':')
        .collect();
    let bad = || format!("{text:?} is not a SHA-256 fingerprint (sha256:AB:CD:… , 32 bytes)");
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// The certificates of a PEM file.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a private key from {}: {e}", path.display()))
}

/// What a client trusts and shows, from `CUMUX_TLS_*`: `None` where neither
/// a fingerprint nor a CA is set (plain TCP).
pub fn client_config_from_env() -> Result<Option<Arc<ClientConfig>>, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let pins = match var(FINGERPRINT_VAR) {
        Some(text) => text
            .split(',')
            .map(parse_fingerprint)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{FINGERPRINT_VAR}: {e}"))?,
        None => Vec::new(),
    };
    let ca = var(CA_VAR);
    if pins.is_empty() && ca.is_none() {
        if var(CERT_VAR).is_some() {
            return Err(format!(
                "{CERT_VAR} is set but neither {FINGERPRINT_VAR} nor {CA_VAR} says which server to trust"
            ));
        }
        return Ok(None);
    }
    let identity = match (var(CERT_VAR), var(KEY_VAR)) {
        (Some(cert), Some(key)) => Some((
            read_certificates(Path::new(&cert))?,
            read_key(Path::new(&key))?,
        )),
        (None, None) => None,
        _ => return Err(format!("{CERT_VAR} and {KEY_VAR} go together")),
    };
    let trust = match ca {
        Some(path) => Trust::Ca(read_certificates(Path::new(&path))?),
        None => Trust::Pinned(pins),
    };
    client_config(trust, identity).map(Some)
}

/// Which server certificates a client accepts.
pub enum Trust {
    /// Exactly these (SHA-256 of the certificate), within their dates.
    Pinned(Vec<[u8; 32]>),
    /// Any that chains to one of these CAs and names the host.
    Ca(Vec<CertificateDer<'static>>),
}

/// A client configuration trusting `trust` and showing `identity`.
pub fn client_config(
    trust: Trust,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<ClientConfig>, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match trust {
        Trust::Ca(cas) => {
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots
                    .add(ca)
                    .map_err(|e| format!("{CA_VAR}: not a CA certificate: {e}"))?;
            }
            builder.with_root_certificates(roots)
        }
        Trust::Pinned(pins) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier { pins, provider })),
    };
    let config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("{CERT_VAR}/{KEY_VAR}: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Accepts a server certificate whose fingerprint is pinned, within its
/// validity dates; the name it gives is not checked (the pin names the server).
#[derive(Debug)]
struct PinnedVerifier {
    pins: Vec<[u8; 32]>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let digest: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if !self.pins.contains(&digest) {
            return Err(rustls::Error::General(format!(
                "the server's certificate ({}) is not the one {FINGERPRINT_VAR} pins",
                fingerprint(end_entity)
            )));
        }
        check_dates(end_entity, now, &self.provider)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A pinned certificate must still be within its dates. It is checked as
/// its own issuer (a self-signed one passes that too); one a CA issued can't
/// be, and is then checked for its dates alone, which webpki looks at first.
fn check_dates(
    cert: &CertificateDer<'_>,
    now: UnixTime,
    provider: &CryptoProvider,
) -> Result<(), rustls::Error> {
    let parsed = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| rustls::Error::InvalidCertificate(CertificateError::Other(other(e))))?;
    let anchors = [webpki::anchor_from_trusted_cert(cert)
        .map_err(|e| rustls::Error::InvalidCertificate(CertificateError::Other(other(e))))?];
    let verified = parsed.verify_for_usage(
        provider.signature_verification_algorithms.all,
        &anchors,
        &[],
        now,
        webpki::KeyUsage::server_auth(),
        None,
        None,
    );
    match verified.map(|_| ()) {
        Ok(()) => Ok(()),
        Err(webpki::Error::CertExpired { .. }) => {
            Err(rustls::Error::InvalidCertificate(CertificateError::Expired))
        }
        Err(webpki::Error::CertNotValidYet { .. }) => Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidYet,
        )),
        // Past its dates, only the chain is left, which the pin stands for.
        Err(_) => Ok(()),
    }
}

fn other(e: webpki::Error) -> rustls::OtherError {
    rustls::OtherError(Arc::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_gcm_is_offered_first() {
        let suites: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert!(suites.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
        assert!(suites.contains(&rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256));
    }

    #[test]
    fn fingerprints_read_back_in_any_spelling() {
        let der = b"not really a certificate";
        let printed = fingerprint(der);
        assert!(printed.starts_with("sha256:"));
        assert_eq!(printed.len(), "sha256:".len() + 32 * 3 - 1);
        let expected: [u8; 32] = Sha256::digest(der).into();
        assert_eq!(parse_fingerprint(&printed).unwrap(), expected);
        let bare: String = printed[7..].replace(':', "").to_lowercase();
        assert_eq!(parse_fingerprint(&bare).unwrap(), expected);
        assert!(parse_fingerprint("sha256:AB:CD").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }
}
