//! `cumux serve --functions ADDR`: the functions API over HTTP/1.1 and HTTP/2
//! (axum on a tokio runtime of its own): register, list, describe, remove and
//! invoke functions (`cumux_functions`), each request as the tenant its
//! bearer token names; the OpenAPI description at `/v1/openapi.json`.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::{Json, Router};
use base64::Engine as _;
use cumux_functions::job;
use cumux_functions::service::Invoking;
use cumux_functions::tensors::{self, Tensor, SAFETENSORS};
use cumux_functions::{Failure, Functions, Placement};
use cumux_protocol::hop_trace::{self, Hop};
use serde_json::{json, Value as Json_};

/// The OpenAPI description of this API.
pub const OPENAPI: &str = include_str!("functions_openapi.json");
/// Threads that run requests' blocking work at once (beyond them, requests wait).
const MAX_BLOCKING_THREADS: usize = 64;
/// Invocation bodies up to this many bytes are read on the runtime's thread
/// (a few microseconds); larger ones on a blocking thread, so that no other
/// connection waits behind them.
const INLINE_DECODE_BYTES: usize = 256 << 10;

type Params = Query<HashMap<String, String>>;

/// Serves the functions API of `functions` on `listener` (HTTPS with `tls`)
/// from a thread of its own, for the life of the process.
pub fn start(
    listener: TcpListener,
    functions: Arc<Functions>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .context("the functions listener")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
        .context("the functions server's runtime")?;
    let app = router(functions);
    std::thread::Builder::new()
        .name("cumux-functions".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                match tls {
                    Some(config) => {
                        let listener = crate::https::TlsListener::new(listener, &config)?;
                        axum::serve(listener, app).await
                    }
                    // Answers go out whole, never held back for more.
                    None => axum::serve(listener.tap_io(no_delay), app).await,
                }
            });
            if let Err(e) = served {
                tracing::error!("the functions server stopped: {e}");
            }
        })
        .context("the functions thread")?;
    Ok(())
}

/// Turns Nagle's algorithm off on a connection: an answer written in two
/// parts must not wait for the client's acknowledgment of the first.
fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("functions: cannot set TCP_NODELAY: {e}");
    }
}

/// The API's routes.
pub fn router(functions: Arc<Functions>) -> Router {
    let limit = functions.limits.max_body_bytes;
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/functions", get(list))
        .route(
            "/v1/functions/{name}",
            get(describe).put(register).delete(remove),
        )
        .route("/v1/functions/{name}/invoke", post(invoke))
        .fallback(|| async {
            refuse(&Failure::NotFound(
                "no such endpoint (see /v1/openapi.json)".into(),
            ))
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(functions)
}

fn refuse(f: &Failure) -> Response {
    let status = StatusCode::from_u16(f.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() {
        tracing::warn!(status = status.as_u16(), "functions: {f}");
    }
    (status, Json(f.body())).into_response()
}

fn answer(result: Result<Json_, Failure>) -> Response {
    match result {
        Ok(body) => (StatusCode::OK, Json(body)).into_response(),
        Err(f) => refuse(&f),
    }
}

/// The bearer token of a request.
fn token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

/// Refuses query parameters other than `allowed`.
fn only(params: &HashMap<String, String>, allowed: &[&str]) -> Result<(), Failure> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(Failure::BadRequest(format!(
            "query: unknown parameter {k:?} (this endpoint takes {})",
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            }
        ))),
        None => Ok(()),
    }
}

/// The body, or why it could not be read (too large: 413).
fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, Failure> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Failure::TooLarge(format!(
            "the body is over this server's limit of {limit} bytes"
        )),
        _ => Failure::BadRequest(format!("the body: {rejection}")),
    })
}

/// Runs `work` as the request's tenant on a blocking thread.
async fn blocking<T: Send + 'static>(
    functions: Arc<Functions>,
    headers: &HeaderMap,
    work: impl FnOnce(&Functions, &(String, cumux_server::tenants::TenantSettings)) -> Result<T, Failure>
        + Send
        + 'static,
) -> Result<T, Failure> {
    let token = token(headers);
    tokio::task::spawn_blocking(move || {
        let _serving = functions.begin()?;
        let tenant = functions.authenticate(token.as_deref())?;
        work(&functions, &tenant)
    })
    .await
    .map_err(|e| Failure::Internal(format!("the request's worker failed: {e}")))?
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn list(State(f): State<Arc<Functions>>, Query(q): Params, headers: HeaderMap) -> Response {
    if let Err(e) = only(&q, &[]) {
        return refuse(&e);
    }
    answer(blocking(f, &headers, |f, t| Ok(f.list(&t.0))).await)
}

async fn describe(
    State(f): State<Arc<Functions>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(blocking(f, &headers, move |f, t| f.describe(&t.0, &name)).await)
}

async fn remove(
    State(f): State<Arc<Functions>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let removed = blocking(f, &headers, move |f, t| {
        f.remove(t, &name)?;
        Ok(json!({ "removed": name }))
    });
    answer(removed.await)
}

/// `PUT /v1/functions/{name}`: `{"plan": {...}, "module": PTX}` or
/// `{"plan": {...}, "module_base64": BYTES}` (cubin, fat binary), and
/// optionally `"invokers": [TENANT, …]`, the other tenants that may invoke it.
async fn register(
    State(f): State<Arc<Functions>>,
    Path(name): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let limit = f.limits.max_body_bytes;
    let parsed = only(&q, &["device"])
        .and_then(|()| Placement::parse(q.get("device").map(String::as_str)))
        .and_then(|placement| Ok((placement, body(raw, limit)?)))
        .and_then(|(placement, bytes)| Ok((placement, registration(&bytes)?)));
    let (placement, (module, plan, invokers)) = match parsed {
        Ok(p) => p,
        Err(e) => return refuse(&e),
    };
    let registered = blocking(f, &headers, move |f, t| {
        f.register(t, &name, placement, module, plan, invokers)
    });
    answer(registered.await)
}

/// The module, plan and other invokers of a registration body.
fn registration(bytes: &[u8]) -> Result<(Vec<u8>, Json_, Vec<String>), Failure> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        plan: Json_,
        module: Option<String>,
        module_base64: Option<String>,
        #[serde(default)]
        invokers: Vec<String>,
    }
    let doc: Doc = serde_json::from_slice(bytes).map_err(|e| {
        Failure::BadRequest(format!(
            "the body: {e} (expected {{\"plan\": {{…}}, \"module\": PTX}} or \"module_base64\")"
        ))
    })?;
    let module = match (doc.module, doc.module_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| Failure::BadRequest(format!("module_base64: {e}")))?,
        _ => {
            return Err(Failure::BadRequest(
                "module: give exactly one of \"module\" (PTX text) and \"module_base64\"".into(),
            ))
        }
    };
    Ok((module, doc.plan, doc.invokers))
}

/// Runs an invocation as the request's tenant: its body read (on a blocking
/// thread past [`INLINE_DECODE_BYTES`]), queued on the tenant's lane, and its
/// answer awaited on the runtime until its deadline; no thread waits for it.
async fn invocation(
    f: Arc<Functions>,
    headers: &HeaderMap,
    name: String,
    bytes: Bytes,
    binary: bool,
    deadline: Option<Duration>,
) -> Result<BTreeMap<String, Tensor>, Failure> {
    hop_trace::mark(Hop::Step, "fn-http-in");
    let _serving = f.begin()?;
    let tenant = f.authenticate(token(headers).as_deref())?;
    let request = if bytes.len() <= INLINE_DECODE_BYTES {
        read_inputs(&f, &tenant.0, &name, &bytes, binary)?
    } else {
        let (f, tenant, name) = (Arc::clone(&f), tenant.0.clone(), name.clone());
        tokio::task::spawn_blocking(move || read_inputs(&f, &tenant, &name, &bytes, binary))
            .await
            .map_err(|e| Failure::Internal(format!("the request's reader failed: {e}")))??
    };
    let Invoking { mut answer, record } = f.start_invoke(&tenant, &name, request, deadline)?;
    hop_trace::mark(Hop::Step, "fn-queued");
    let result = match poll_alone(&f, &answer).await {
        Some(result) => result,
        None => {
            let at = tokio::time::Instant::from_std(answer.deadline());
            match tokio::time::timeout_at(at, &mut answer).await {
                Ok(result) => result,
                Err(_) => answer.expire(),
            }
        }
    };
    hop_trace::mark(Hop::Step, "fn-http-resumed");
    poll_for_next(&f);
    f.finish_invoke(record, result)
}

/// Once a lone request has its answer, the runtime's thread polls a while for
/// the next request rather than sleep in the kernel and be woken for it
/// (where the host has cores for it: [`job::answer_poll`]), so that a client
/// that sends each request when the last is answered finds it awake, as it
/// finds the lane and the worker. It yields to the runtime (which looks at
/// its sockets between) and stops as soon as another request begins.
fn poll_for_next(f: &Arc<Functions>) {
    let poll = job::answer_poll();
    if poll.is_zero() || !f.alone() {
        return;
    }
    let (f, seen) = (Arc::clone(f), f.begun());
    tokio::spawn(async move {
        let until = Instant::now() + poll;
        while f.begun() == seen && Instant::now() < until {
            tokio::task::yield_now().await;
        }
    });
}

/// The only request in flight polls for its answer a while (where the host
/// has cores for it: [`job::answer_poll`]) rather than have its runtime
/// thread sleep and be woken for an answer tens of microseconds away. It
/// yields to the runtime's other tasks between looks, and stops as soon as
/// another request is in flight: a thread held by a poll under load cost a
/// third of the throughput at 16 clients.
async fn poll_alone<T>(f: &Functions, answer: &job::Pending<T>) -> Option<Result<T, Failure>> {
    let poll = job::answer_poll();
    if poll.is_zero() {
        return None;
    }
    let until = Instant::now() + poll;
    while f.alone() && Instant::now() < until {
        if let Some(result) = answer.ready() {
            return Some(result);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// The inputs of an invocation body of function `name` (safetensors, or JSON
/// whose bare lists take the function's input types).
fn read_inputs(
    f: &Functions,
    tenant: &str,
    name: &str,
    bytes: &[u8],
    binary: bool,
) -> Result<tensors::Request, Failure> {
    match binary {
        true => tensors::read_safetensors(bytes),
        false => {
            let dtypes = f.input_dtypes(tenant, name)?;
            tensors::read_json(bytes, &|n| dtypes.get(n).copied())
        }
    }
    .map_err(Failure::BadRequest)
}

/// Whether a media type names the binary tensor form.
fn is_binary(media: &str) -> bool {
    let media = media.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case(SAFETENSORS)
        || media.eq_ignore_ascii_case("application/octet-stream")
}

/// `POST /v1/functions/{name}/invoke[?deadline_ms=N]`: inputs as safetensors
/// or JSON; outputs in the form `Accept` asks for, else the request's.
async fn invoke(
    State(f): State<Arc<Functions>>,
    Path(name): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let limit = f.limits.max_body_bytes;
    let deadline = match only(&q, &["deadline_ms"]).and_then(|()| {
        q.get("deadline_ms")
            .map(|ms| {
                ms.parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        Failure::BadRequest(format!(
                            "deadline_ms: {ms:?} is not a positive number of milliseconds"
                        ))
                    })
            })
            .transpose()
    }) {
        Ok(d) => d,
        Err(e) => return refuse(&e),
    };
    let bytes = match body(raw, limit) {
        Ok(b) => b,
        Err(e) => return refuse(&e),
    };
    let media = |h: header::HeaderName| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let content = media(header::CONTENT_TYPE);
    let binary_in = is_binary(&content);
    if !binary_in && !content.is_empty() && !content.starts_with("application/json") {
        let why = format!("Content-Type {content:?}: send application/json or {SAFETENSORS}");
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Json(json!({ "error": why })),
        )
            .into_response();
    }
    let accept = media(header::ACCEPT);
    let binary_out = accept.split(',').any(is_binary) || (binary_in && !accept.contains("json"));
    let outputs = invocation(f, &headers, name, bytes, binary_in, deadline).await;
    let encoded = outputs.and_then(|out| match binary_out {
        true => tensors::write_safetensors(&out)
            .map(|b| ([(header::CONTENT_TYPE, SAFETENSORS)], b).into_response())
            .map_err(Failure::Internal),
        false => tensors::write_json(&out)
            .map(|j| Json(j).into_response())
            .map_err(Failure::BadRequest),
    });
    hop_trace::mark(Hop::Step, "fn-http-out");
    match encoded {
        Ok(response) => response,
        Err(f) => refuse(&f),
    }
}
