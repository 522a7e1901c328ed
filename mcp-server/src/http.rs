//! MCP over streamable HTTP: the SDK's service behind a front that enforces the body limit
//! and the session cap and answers bad input with JSON-RPC error bodies.

use crate::handler::{ExecServer, Shared, DRAIN_TIMEOUT};
use crate::jsonrpc::{check_message, Checked, Rejection};
use crate::{validate, ServeError, ServeSettings, SESSION_IDLE_TIMEOUT};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use vibeos_tools::ToolRegistry;

/// Serves MCP over streamable HTTP on `addr` (loopback only) at path `/mcp` until `stop`
/// fires; `on_listening` is told the bound address (useful with port 0).
pub async fn serve_http(
    registry: &'static ToolRegistry,
    settings: ServeSettings,
    addr: SocketAddr,
    stop: CancellationToken,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    validate(registry, &settings)?;
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    crate::approval::install();
    let shared = Shared::new(registry, settings);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.child_token();
    config.max_request_body_bytes = shared.settings.max_request_bytes;
    config = config.with_allowed_hosts([
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        format!("localhost:{}", bound.port()),
        format!("127.0.0.1:{}", bound.port()),
        format!("[::1]:{}", bound.port()),
    ]);
    let factory_shared = shared.clone();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE_TIMEOUT);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        move || {
            Ok(ExecServer {
                conn: factory_shared.next_id(),
                shared: factory_shared.clone(),
            })
        },
        sessions.clone(),
        config,
    );
    let limits = HttpLimits {
        max_body: shared.settings.max_request_bytes,
        max_sessions: shared.settings.max_sessions,
        sessions,
    };
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(move |req, next| {
                check_http_request(req, next, limits.clone())
            }));
    on_listening(bound);
    let stopped = stop.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move { stopped.cancelled().await })
        .await;
    shared.interrupt(None);
    shared.wait_idle(None, DRAIN_TIMEOUT).await;
    served.map_err(|e| ServeError::Io(e.to_string()))
}

/// Most bytes of an oversized body read and thrown away before answering 413: a client still
/// sending would otherwise see its connection reset instead of the answer.
const DRAIN_CAP: usize = 256 * 1024 * 1024;

/// Reads a body of at most `limit` bytes; `None` if it is larger (the rest is drained, up to
/// [`DRAIN_CAP`]) or cannot be read.
async fn read_body_draining(mut body: axum::body::Body, limit: usize) -> Option<axum::body::Bytes> {
    use http_body::Body as _;
    let mut kept = Vec::new();
    let mut total = 0usize;
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Err(_)) => return None,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    total = total.saturating_add(data.len());
                    if total <= limit {
                        kept.extend_from_slice(&data);
                    } else if total > DRAIN_CAP {
                        return None;
                    }
                }
            }
        }
    }
    (total <= limit).then(|| axum::body::Bytes::from(kept))
}

/// What the HTTP front checks before the SDK sees a request.
#[derive(Clone)]
struct HttpLimits {
    /// Largest body (`--max-request-bytes`).
    max_body: usize,
    /// Sessions open at once (`--max-sessions`).
    max_sessions: usize,
    /// The SDK's session table, to count open sessions.
    sessions: Arc<LocalSessionManager>,
}

/// Checks a request before the SDK sees it, so bad input gets a JSON-RPC error body (the SDK
/// would answer 415 with plain text): a body over the limit → 413 with -32600; unparsable or not
/// JSON-RPC → 400 with -32700 / -32600 / -32602 as [`check_message`] decides; a new session
/// beyond `--max-sessions` → 503 with -32000. A successful `DELETE` (session closed) answers 200:
/// the SDK answers 202, which the official clients log as a failed termination.
async fn check_http_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    limits: HttpLimits,
) -> axum::response::Response {
    use axum::http::{header, Method, StatusCode};
    use axum::response::IntoResponse;
    if req.method() == Method::DELETE {
        let mut response = next.run(req).await;
        if response.status() == StatusCode::ACCEPTED {
            *response.status_mut() = StatusCode::OK;
        }
        return response;
    }
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let limit = limits.max_body;
    let json_error = |status: StatusCode, rejection: Rejection| {
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            rejection.to_json().to_string(),
        )
            .into_response()
    };
    let opens_session = !req.headers().contains_key("mcp-session-id");
    if opens_session && limits.sessions.sessions.read().await.len() >= limits.max_sessions {
        // Read the body before refusing: a response sent over an unread body makes the server
        // close the connection, and a client that already reused it for its next request (the
        // official one does) sees "Server disconnected" instead of an answer.
        let _ = read_body_draining(req.into_body(), limit).await;
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            Rejection {
                code: -32000,
                message: format!(
                    "Server busy: {} MCP sessions are open (--max-sessions); close one (DELETE \
                     /mcp with its Mcp-Session-Id) or retry when an idle one expires ({}s)",
                    limits.max_sessions,
                    SESSION_IDLE_TIMEOUT.as_secs()
                ),
                id: Value::Null,
            },
        );
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_body_draining(body, limit).await {
        Some(b) => b,
        None => {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Rejection {
                    code: -32600,
                    message: format!(
                        "Invalid Request: the body is larger than {limit} bytes (--max-request-bytes) or could not be read"
                    ),
                    id: Value::Null,
                },
            )
        }
    };
    let id = match check_message(&bytes) {
        Checked::Reject(rejection) => return json_error(StatusCode::BAD_REQUEST, rejection),
        Checked::Message(m) => request_id(&m),
        Checked::Ignore => Value::Null,
    };
    let mut parts = parts;
    let gone = CancellationToken::new();
    parts.extensions.insert(ClientGone(gone.clone()));
    let response = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await;
    // The SDK answers some requests it refuses (no session id, an unknown or expired session)
    // with plain text; a client that parses JSON-RPC gets the same words as an error object.
    if response.status().is_client_error() && !is_json(&response) {
        let status = response.status();
        let text = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        let message = if text.is_empty() {
            format!("Invalid Request: HTTP {status}")
        } else {
            text
        };
        return json_error(
            status,
            Rejection {
                code: -32600,
                message,
                id,
            },
        );
    }
    // The response stream of a tools/call is dropped when it is finished or when the client
    // hangs up; either way the call's execution has no one left to report to.
    let guard = gone.drop_guard();
    response.map(|inner| {
        axum::body::Body::new(GuardedBody {
            inner,
            _guard: guard,
        })
    })
}

/// The id of a request (null for a notification or a response), for an error reply to it.
fn request_id(message: &rmcp::model::ClientJsonRpcMessage) -> Value {
    match message {
        rmcp::model::JsonRpcMessage::Request(r) => {
            serde_json::to_value(&r.id).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    }
}

/// Whether a response's body is JSON or an event stream (what the SDK answers MCP with).
fn is_json(response: &axum::response::Response) -> bool {
    response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("json") || t.contains("event-stream"))
}

/// Fires when the HTTP response of the request that carries it is dropped (sent, or the client
/// disconnected). Handed to the handler through the request's extensions.
#[derive(Clone)]
pub(crate) struct ClientGone(pub(crate) CancellationToken);

/// A response body that fires its request's [`ClientGone`] when dropped.
struct GuardedBody {
    inner: axum::body::Body,
    _guard: tokio_util::sync::DropGuard,
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
