//! A small HTTP client of the functions API (hyper's, on a one-thread tokio
//! runtime): one request at a time, a bearer token on each, HTTP/1.1 or
//! HTTP/2 with prior knowledge; HTTPS trusting what `CUMUX_TLS_FINGERPRINT`
//! or `CUMUX_TLS_CA` says. `cumux fn` and the tests use it.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How long one request may take, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// An answer: status, media type and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (`null` if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A client of one functions server.
pub struct FnClient {
    base: String,
    token: Option<String>,
    runtime: tokio::runtime::Runtime,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    pub timeout: Duration,
}

impl FnClient {
    /// A client of the server at `url` (`http://HOST:PORT` or `https://…`),
    /// sending `token`; `http2` speaks HTTP/2 with prior knowledge instead of
    /// HTTP/1.1 (over HTTPS, ALPN chooses).
    pub fn new(url: &str, token: Option<&str>, http2: bool) -> Result<FnClient> {
        let base = url.trim_end_matches('/').to_string();
        let tls = match (base.starts_with("https://"), base.starts_with("http://")) {
            (true, _) => {
                let config = cumux_protocol::tls::client_config_from_env()
                    .map_err(anyhow::Error::msg)?
                    .with_context(|| {
                        format!(
                            "{url}: set {} (the fingerprint `cumux serve` prints) or {} to \
                             trust the server",
                            cumux_protocol::tls::FINGERPRINT_VAR,
                            cumux_protocol::tls::CA_VAR
                        )
                    })?;
                Some((*config).clone())
            }
            (false, true) => None,
            _ => bail!("{url}: the functions API is served over http:// or https://"),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("the HTTP client's runtime")?;
        let connector = match tls {
            Some(config) => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_only()
                .enable_http1()
                .enable_http2()
                .build(),
            None => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(
                    rustls::ClientConfig::builder_with_provider(cumux_protocol::tls::provider())
                        .with_safe_default_protocol_versions()
                        .context("TLS")?
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .enable_http2()
                .build(),
        };
        let client = Client::builder(TokioExecutor::new())
            .http2_only(http2)
            .build(connector);
        Ok(FnClient {
            base,
            token: token.map(str::to_string),
            runtime,
            client,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// `METHOD path` with `body` (of `content_type`), asking for `accept`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        accept: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Reply> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .context("building the request")?;
        let what = format!("{method} {}{path}", self.base);
        self.runtime.block_on(async {
            let sent = tokio::time::timeout(self.timeout, async {
                let response = self.client.request(request).await?;
                let status = response.status().as_u16();
                let content_type = response
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = response.into_body().collect().await?.to_bytes().to_vec();
                anyhow::Ok(Reply {
                    status,
                    content_type,
                    body,
                })
            })
            .await;
            match sent {
                Ok(reply) => reply.with_context(|| what.clone()),
                Err(_) => bail!("{what}: no answer within {:?}", self.timeout),
            }
        })
    }

    /// `request` with a JSON body.
    pub fn json(&self, method: &str, path: &str, body: &serde_json::Value) -> Result<Reply> {
        self.request(
            method,
            path,
            Some("application/json"),
            None,
            body.to_string().into_bytes(),
        )
    }
}
