//! `cumux serve --metrics ADDR`: an HTTP server (axum, on a one-thread tokio
//! runtime of its own) that answers `GET /metrics` with the server's metrics
//! (`cumux_server::metrics`), and its functions' where it serves them, in
//! Prometheus' text format.

use std::net::TcpListener;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use cumux_functions::Functions;
use cumux_server::Server;

/// Prometheus' text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `/metrics` of `server` (and of its `functions`, if any) on
/// `listener` from a thread of its own, for the life of the process.
pub fn start(
    listener: TcpListener,
    server: Arc<Server>,
    functions: Option<Arc<Functions>>,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .context("the metrics listener")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("the metrics server's runtime")?;
    std::thread::Builder::new()
        .name("cumux-metrics".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let app = Router::new().route(
                    "/metrics",
                    get(move || metrics(Arc::clone(&server), functions.clone())),
                );
                axum::serve(listener, app).await
            });
            if let Err(e) = served {
                tracing::error!("the metrics server stopped: {e}");
            }
        })
        .context("the metrics thread")?;
    Ok(())
}

async fn metrics(server: Arc<Server>, functions: Option<Arc<Functions>>) -> impl IntoResponse {
    let rendered = cumux_server::metrics::render(&server).and_then(|mut text| {
        if let Some(functions) = &functions {
            text += &functions.metrics()?;
        }
        Ok(text)
    });
    match rendered {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, TEXT_FORMAT)], text),
        Err(e) => {
            tracing::error!("metrics: {e}");
            let text = format!("cannot render the metrics: {e}\n");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, TEXT_FORMAT)],
                text,
            )
        }
    }
}
