//! MCP over streamable HTTP: the SDK's service behind a front that enforces the body limit
//! and the session cap and answers bad input with JSON-RPC error bodies.

use crate::handler::{ExecServer, Shared, DRAIN_TIMEOUT};
use crate::inflight::{ConnKey, FrontHold, InFlight};
use crate::jsonrpc::{check_message, reply_id, Checked, Rejection};
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
    let shared = Shared::new(
        registry,
        settings,
        crate::fair_slots::MAX_WAITING_PER_SESSION,
    );
    {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || shared.warn_idle_toolsets());
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let mut config = StreamableHttpServerConfig::default();
    // The SDK's sessions end after the calls are answered, not at the signal: stopped with it,
    // every call's response stream ended unanswered ("SSE stream ended") and a queued call's
    // handler took the stop for its client's cancellation.
    let sessions_stop = CancellationToken::new();
    config.cancellation_token = sessions_stop.clone();
    config.max_request_body_bytes = shared.settings.max_request_bytes;
    // The bound address is a name clients may use too (`--http 127.0.0.2:P`: every request
    // to it was refused for its Host).
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        format!("localhost:{}", bound.port()),
        format!("127.0.0.1:{}", bound.port()),
        format!("[::1]:{}", bound.port()),
    ];
    for host in [bound.ip().to_string(), bound.to_string()] {
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    config = config.with_allowed_hosts(hosts);
    let factory_shared = shared.clone();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE_TIMEOUT);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        move || {
            Ok(ExecServer::new(
                factory_shared.clone(),
                factory_shared.next_id(),
            ))
        },
        sessions.clone(),
        config,
    );
    let limits = HttpLimits {
        max_body: shared.settings.max_request_bytes,
        max_sessions: shared.settings.max_sessions,
        sessions,
        opening: Arc::new(tokio::sync::Mutex::new(())),
        bound: bound.ip(),
        in_flight: shared.in_flight.clone(),
    };
    let router =
        axum::Router::new()
            .route_service(MCP_PATH, service)
            .layer(axum::middleware::from_fn(move |req, next| {
                check_http_request(req, next, limits.clone())
            }));
    on_listening(bound);
    {
        let (shared, stop, sessions_stop) = (shared.clone(), stop.clone(), sessions_stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            answer_then_end_sessions(&shared, &sessions_stop).await;
        });
    }
    accept_until_stopped(listener, router, &stop).await;
    // Every connection is closed: nothing is left to answer.
    sessions_stop.cancel();
    shared.interrupt(None);
    shared.wait_idle(None, DRAIN_TIMEOUT).await;
    Ok(())
}

/// The ordered stop of the HTTP server, as stdio's ([`Shared::answer_last_calls`]), then the
/// sessions end, which ends the streams (a client's `GET`) that would keep their connections
/// open.
async fn answer_then_end_sessions(shared: &Shared, sessions_stop: &CancellationToken) {
    shared.answer_last_calls(None).await;
    sessions_stop.cancel();
}

/// How long a client has to send a request's headers, counted from when the server waits for
/// them: on a new connection, and on a kept-alive one between requests.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves each connection of `listener` with `router` until `stop` fires, then lets every
/// connection finish what it is answering and returns once all are closed.
///
/// Not `axum::serve`: its connections have no header timeout (hyper's needs a timer, which it
/// does not set), so a connection that sent nothing, or half a request line, stayed open for
/// ever, and about 1,000 of them used up a default descriptor limit and locked every client
/// out. Here each connection is hyper's HTTP/1 with the Tokio timer and
/// [`HEADER_READ_TIMEOUT`]; a response being streamed (the SSE of a GET) is not a header read
/// and is not cut.
async fn accept_until_stopped(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    stop: &CancellationToken,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was taken: the
                    // listener itself is fine, and a busy loop would not help.
                    tracing::warn!("mcp: accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Finished connections are collected as they go, not only at the end.
        while connections.try_join_next().is_some() {}
        let router = router.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            let answering = client_of_another_user(&stream).await.unwrap_or(router);
            let service = hyper_util::service::TowerToHyperService::new(answering);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    while connections.join_next().await.is_some() {}
}

/// For a connection whose client runs as another user than this server: a router that answers
/// every request 403 saying so; `None` for the server's own user.
///
/// Binding to loopback keeps other machines out, not other users of this one: any local
/// account could open a session and run code as the server's user (as root, for a root
/// server; stop 60's probe). The client end of a loopback connection is a socket on this
/// machine, whose owner the kernel lists in /proc/net/tcp{,6}. A connection whose client
/// cannot be found there (it closed already) is refused too.
async fn client_of_another_user(stream: &tokio::net::TcpStream) -> Option<axum::Router> {
    let me = rustix::process::geteuid().as_raw();
    let (peer, local) = (stream.peer_addr().ok(), stream.local_addr().ok());
    let owner = match (peer, local) {
        (Some(peer), Some(local)) => tokio::task::spawn_blocking(move || socket_owner(peer, local))
            .await
            .ok()
            .flatten(),
        _ => None,
    };
    if owner == Some(me) {
        return None;
    }
    let who = owner.map_or_else(|| "an unknown user".to_string(), |uid| format!("uid {uid}"));
    tracing::warn!("mcp: refused a connection from {who}: this server answers uid {me} only");
    let message = format!(
        "Forbidden: this server answers its own user (uid {me}) only, and this connection's \
         client runs as {who}; start your own `vibeos-exec serve`, or use stdio"
    );
    Some(axum::Router::new().fallback(move || {
        let message = message.clone();
        async move {
            json_error(
                axum::http::StatusCode::FORBIDDEN,
                Rejection {
                    code: -32600,
                    message,
                    id: Value::Null,
                },
            )
        }
    }))
}

/// The uid owning the TCP socket on this machine whose address is `client` and whose peer is
/// `server`: the client end of a connection this server accepted.
fn socket_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    use procfs_core::FromReadSI;
    let system = procfs_core::ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 100,
        page_size: 4096,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let table = if client.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let file = std::fs::File::open(table).ok()?;
    let entries = procfs_core::net::TcpNetEntries::from_read(file, &system).ok()?;
    entries
        .0
        .into_iter()
        .find(|e| e.local_address == client && e.remote_address == server)
        .map(|e| e.uid)
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

/// The path MCP is served at.
const MCP_PATH: &str = "/mcp";

/// The body of a request that is refused anyway, read (so the connection stays usable) within
/// [`BODY_READ_TIMEOUT`]; `None` if it is too large, late or unreadable.
async fn drain(req: axum::extract::Request, limits: &HttpLimits) -> Option<axum::body::Bytes> {
    tokio::time::timeout(
        BODY_READ_TIMEOUT,
        read_body_draining(req.into_body(), limits.max_body),
    )
    .await
    .ok()
    .flatten()
}

/// The id of the JSON-RPC message `body` (null when it has none or cannot be read).
fn body_id(body: Option<&[u8]>) -> Value {
    let value = body.and_then(|b| serde_json::from_slice::<Value>(b).ok());
    reply_id(value.as_ref().and_then(|v| v.get("id")))
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
    /// Held by a request that may open a session from its count to the session's creation, so
    /// that concurrent `initialize` calls cannot all pass the count (100 at once all opened).
    opening: Arc<tokio::sync::Mutex<()>>,
    /// The address served, an origin besides the loopback names.
    bound: std::net::IpAddr,
    /// The request ids each session has in flight.
    in_flight: Arc<InFlight>,
}

/// How long a request's body may take to arrive: a client sending a byte every few seconds
/// held its connection (and a file descriptor) for as long as it liked.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether an `Origin` header names a loopback origin (`http://localhost:3000`,
/// `http://127.0.0.1`, `http://[::1]:8080`, or the served address), as the MCP transport asks
/// servers to check against DNS rebinding. `null` and other hosts are not.
fn loopback_origin(origin: &str, bound: std::net::IpAddr) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let Ok(authority) = rest.parse::<axum::http::uri::Authority>() else {
        return false;
    };
    if rest != authority.as_str() || authority.as_str().contains('@') {
        return false;
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            ip == bound
                || ip == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
                || ip == std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        })
}

/// Checks a request before the SDK sees it, so bad input gets a JSON-RPC error body (the SDK
/// would answer 415 with plain text): an `Origin` that is not loopback → 403; a body over the
/// limit → 413 with -32600, one that does not arrive within [`BODY_READ_TIMEOUT`] → 408;
/// unparsable or not JSON-RPC → 400 with -32700 / -32600 / -32602 as [`check_message`]
/// decides; a request that would open a session (an `initialize` without a session id)
/// beyond `--max-sessions` → 503 with -32000, while other requests keep their usual answers; a
/// request reusing the id of one its session still runs → 400 with -32600; a path other than
/// `/mcp` → 404. Refusals carry the request's id when its body could be read. `DELETE` of a session
/// that is not open → 404; a successful one answers 200 (the SDK answers 202, which the
/// official clients log as a failed termination). The SDK's plain-text refusals (no session
/// id, an unknown session, a bad Host) become JSON-RPC errors with the same words.
async fn check_http_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    limits: HttpLimits,
) -> axum::response::Response {
    use axum::http::{header, Method, StatusCode};
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        if !loopback_origin(&origin, limits.bound) {
            let id = if req.method() == Method::POST {
                // Read the body first, as for a refused session (see below); its id, when it
                // can be read, goes into the reply as for every other refusal.
                body_id(drain(req, &limits).await.as_deref())
            } else {
                Value::Null
            };
            return json_error(
                StatusCode::FORBIDDEN,
                Rejection {
                    code: -32600,
                    message: format!(
                        "Forbidden: Origin {origin:?} is not a loopback origin; this server \
                         answers only pages and clients on this machine (localhost, 127.0.0.1, \
                         [::1])"
                    ),
                    id,
                },
            );
        }
    }
    // Only the MCP path is served; the SDK's service, mounted there, would answer any path.
    if req.uri().path() != MCP_PATH {
        let path = req.uri().path().to_string();
        let id = if req.method() == Method::POST {
            body_id(drain(req, &limits).await.as_deref())
        } else {
            Value::Null
        };
        return json_error(
            StatusCode::NOT_FOUND,
            Rejection {
                code: -32600,
                message: format!("Not Found: {path:?}; this server answers MCP at {MCP_PATH} only"),
                id,
            },
        );
    }
    if req.method() == Method::DELETE {
        let id = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(id) = id {
            if !limits
                .sessions
                .sessions
                .read()
                .await
                .contains_key(id.as_str())
            {
                return json_error(
                    StatusCode::NOT_FOUND,
                    Rejection {
                        code: -32600,
                        message: format!(
                            "Session not found: {id:?} is not open (closed, expired or never \
                             opened); there is nothing to delete"
                        ),
                        id: Value::Null,
                    },
                );
            }
        }
        let mut response = next.run(req).await;
        if response.status() == StatusCode::ACCEPTED {
            *response.status_mut() = StatusCode::OK;
        }
        return as_json_rpc(response, Value::Null).await;
    }
    if req.method() != Method::POST {
        return as_json_rpc(next.run(req).await, Value::Null).await;
    }
    let limit = limits.max_body;
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(BODY_READ_TIMEOUT, read_body_draining(body, limit)).await
    {
        Ok(Some(b)) => b,
        Ok(None) => {
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
        Err(_) => {
            return json_error(
                StatusCode::REQUEST_TIMEOUT,
                Rejection {
                    code: -32600,
                    message: format!(
                        "Invalid Request: the body did not arrive within {}s; send the whole \
                         request at once",
                        BODY_READ_TIMEOUT.as_secs()
                    ),
                    id: Value::Null,
                },
            )
        }
    };
    let message = match check_message(&bytes) {
        Checked::Reject(rejection) => return json_error(StatusCode::BAD_REQUEST, rejection),
        Checked::Message(m) => Some(m),
        Checked::Ignore => None,
    };
    let id = message.as_deref().map(request_id).unwrap_or(Value::Null);
    // The body is read before a refusal: a response sent over an unread body makes the server
    // close the connection, and a client that already reused it for its next request (the
    // official one does) sees "Server disconnected" instead of an answer. Only a request that
    // would open a session meets the cap: any other gets its usual answer (a ping without a
    // session id: 400 "Session ID is required"; a text/plain body: 415).
    let opening = if opens_session(&parts.headers, message.as_deref()) {
        let guard = limits.opening.clone().lock_owned().await;
        if limits.sessions.sessions.read().await.len() >= limits.max_sessions {
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
                    id,
                },
            );
        }
        Some(guard)
    } else {
        None
    };
    // A request whose id a request of the same session still runs under is refused: the SDK
    // would drop the running one's response (crate::inflight).
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(|s| ConnKey::Session(s.to_string()));
    let held = match (session, message.as_deref()) {
        (Some(conn), Some(rmcp::model::JsonRpcMessage::Request(r))) => {
            let table = &limits.in_flight;
            let call = matches!(r.request, rmcp::model::ClientRequest::CallToolRequest(_));
            if !table.begin(&conn, &r.id, call) {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    Rejection {
                        code: -32600,
                        message: InFlight::in_use_message(&r.id),
                        id,
                    },
                );
            }
            Some(FrontHold {
                table: table.clone(),
                conn,
                id: r.id.clone(),
            })
        }
        _ => None,
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
    // The session (if this request opened one) is in the table now; the next may count.
    drop(opening);
    if !response.status().is_success() {
        // Refused before any handler saw it.
        if let Some(held) = &held {
            held.table.forget(&held.conn, &held.id);
        }
    }
    if response.status().is_client_error() && !is_json(&response) {
        return as_json_rpc(response, id).await;
    }
    // The response stream of a tools/call is dropped when it is finished or when the client
    // hangs up; either way the call's execution has no one left to report to.
    // So is the request's id: it is free again once the stream ended (crate::inflight).
    let guard = gone.drop_guard();
    response.map(|inner| {
        axum::body::Body::new(GuardedBody {
            inner,
            _guard: guard,
            _held: held,
        })
    })
}

/// Whether the SDK would open a session for this request: an `initialize` without a session id
/// that passes the SDK's header checks (an `Accept` naming JSON and SSE, a JSON
/// `Content-Type`). Those are the requests the session cap applies to.
fn opens_session(
    headers: &axum::http::HeaderMap,
    message: Option<&rmcp::model::ClientJsonRpcMessage>,
) -> bool {
    use axum::http::header::{ACCEPT, CONTENT_TYPE};
    let initialize = matches!(
        message,
        Some(rmcp::model::JsonRpcMessage::Request(r))
            if matches!(r.request, rmcp::model::ClientRequest::InitializeRequest(_))
    );
    let essences = |name| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .collect::<Vec<_>>()
    };
    let accepts = essences(ACCEPT);
    initialize
        && !headers.contains_key("mcp-session-id")
        && accepts.iter().any(|t| t == "application/json")
        && accepts.iter().any(|t| t == "text/event-stream")
        && essences(CONTENT_TYPE)
            .first()
            .is_some_and(|t| t == "application/json")
}

/// A JSON-RPC error response with `status`.
fn json_error(status: axum::http::StatusCode, rejection: Rejection) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        rejection.to_json().to_string(),
    )
        .into_response()
}

/// `response` as it is, unless it is a refusal in plain text (the SDK answers some so: no
/// session id, an unknown or expired session, a bad Host): then the same words as a JSON-RPC
/// error object, for the request `id`, so a client that parses JSON-RPC can read them.
async fn as_json_rpc(response: axum::response::Response, id: Value) -> axum::response::Response {
    if !response.status().is_client_error() || is_json(&response) {
        return response;
    }
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
    json_error(
        status,
        Rejection {
            code: -32600,
            message,
            id,
        },
    )
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
    _held: Option<FrontHold>,
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
