//! `vibeos-exec serve`: execute_code (and optionally other registry tools) as a Model Context
//! Protocol server.
//!
//! Agents that are not written in Python speak MCP; serving execute_code over it makes the
//! product usable by all of them without glue code. The protocol machinery is the official SDK
//! (`rmcp`); this module adds what is specific to execute_code:
//!
//! - the tool list is generated from the registry at each `tools/list`, so `execute_code`
//!   describes exactly the script tools available now and the configured limits;
//! - executions run concurrently up to `--max-concurrent`, the rest wait in a queue; with a
//!   `progressToken` the client hears about both phases through `notifications/progress`;
//! - `notifications/cancelled` interrupts the execution (status `interrupted`), and a client
//!   that goes away gets every execution it started interrupted, so no process or staging dir
//!   outlives its connection;
//! - over stdio, lines are framed by our own transport ([`StdioLines`]) rather than the SDK's,
//!   because the SDK silently drops unparsable and oversized lines while JSON-RPC asks for a
//!   `-32700 Parse error` / `-32600 Invalid Request` reply. Over HTTP the SDK's streamable HTTP
//!   service answers those itself (HTTP 400/413 with a JSON-RPC error body).

mod approval;
mod fair_slots;
mod handler;
mod http;
mod inflight;
mod jsonrpc;
mod stdio;

pub use http::serve_http;
pub use jsonrpc::{check_message, Checked, Rejection};
pub use stdio::{serve_stdio, StdioLines};

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use vibeos_supervisor::Config;
use vibeos_tools::ToolRegistry;

/// Largest request accepted by default (one stdio line, or one HTTP body): 4 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// What `serve` was configured with.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Configuration with the command line's `--mode`, `--timeout` and `--max-tool-calls`
    /// already applied: the defaults of every call.
    pub config: Config,
    /// Session working dir of every execution (`--cwd`, else `TERMINAL_CWD`, else the cwd).
    pub cwd: PathBuf,
    /// Toolsets whose tools are offered besides execute_code (`--toolsets`).
    pub toolsets: Vec<String>,
    /// Executions allowed to run at once; more wait in a queue.
    pub max_concurrent: usize,
    /// Largest accepted request in bytes.
    pub max_request_bytes: usize,
    /// HTTP sessions open at once (`--max-sessions`); an `initialize` beyond it gets 503 until one
    /// ends (DELETE, or idle for [`SESSION_IDLE_TIMEOUT`]).
    pub max_sessions: usize,
}

/// Default `--max-sessions`: each open HTTP session holds a worker and its buffers (tens of
/// KB), so clients that never close theirs must not be able to grow the server without bound.
pub const DEFAULT_MAX_SESSIONS: usize = 64;

/// An HTTP session with no request for this long is closed by the server.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `--http` named something that is not `IP:PORT` / `localhost:PORT`.
    #[error("--http {0:?} is not an address; use 127.0.0.1:PORT (or [::1]:PORT, localhost:PORT)")]
    BadAddress(String),
    /// `--http` named a host by a name other than `localhost`, which may resolve anywhere.
    #[error("--http {0:?}: only IP addresses and localhost are accepted (a name may resolve to another machine); use 127.0.0.1:PORT (or [::1]:PORT, localhost:PORT)")]
    HostName(String),
    /// `--http` named an address other machines could reach.
    #[error("refusing to serve on {0}: it is not a loopback address, and the server runs code for whoever connects; use 127.0.0.1:PORT (or [::1]:PORT)")]
    NotLoopback(SocketAddr),
    /// The listener could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// `--toolsets` named something the registry does not know.
    #[error("--toolsets: {0}")]
    Toolsets(String),
    /// `--max-concurrent`, `--max-request-bytes` or `--max-sessions` is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The transport failed.
    #[error("the MCP server stopped: {0}")]
    Io(String),
}

/// Parses `--http`: an `IP:PORT` (or `localhost:PORT`) that must be a loopback address.
pub fn parse_http_addr(text: &str) -> Result<SocketAddr, ServeError> {
    let addr = match text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            let (host, port) = text
                .rsplit_once(':')
                .ok_or_else(|| ServeError::BadAddress(text.into()))?;
            let port: u16 = port
                .parse()
                .map_err(|_| ServeError::BadAddress(text.into()))?;
            if host.eq_ignore_ascii_case("localhost") {
                SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port)
            } else {
                return match host.parse::<IpAddr>() {
                    Ok(ip) => Err(ServeError::NotLoopback(SocketAddr::new(ip, port))),
                    Err(_) if host.is_empty() => Err(ServeError::BadAddress(text.into())),
                    // A name other than localhost may resolve anywhere.
                    Err(_) => Err(ServeError::HostName(text.into())),
                };
            }
        }
    };
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    Ok(addr)
}

/// Checks the settings and the toolset names before any client connects.
pub(crate) fn validate(
    registry: &'static ToolRegistry,
    settings: &ServeSettings,
) -> Result<(), ServeError> {
    if settings.max_concurrent == 0 {
        return Err(ServeError::Zero("--max-concurrent"));
    }
    if settings.max_request_bytes == 0 {
        return Err(ServeError::Zero("--max-request-bytes"));
    }
    if settings.max_sessions == 0 {
        return Err(ServeError::Zero("--max-sessions"));
    }
    registry
        .select_tools(&settings.toolsets, &[])
        .map_err(|e| ServeError::Toolsets(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_addresses_must_be_loopback() {
        assert_eq!(
            parse_http_addr("127.0.0.1:8765").unwrap(),
            "127.0.0.1:8765".parse().unwrap()
        );
        assert_eq!(
            parse_http_addr("[::1]:0").unwrap(),
            "[::1]:0".parse().unwrap()
        );
        assert_eq!(
            parse_http_addr("localhost:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert!(
            parse_http_addr("127.1.2.3:80").is_ok(),
            "all of 127/8 is loopback"
        );
        for bad in ["0.0.0.0:80", "10.0.0.1:80", "[::]:80", "192.168.1.1:1"] {
            assert!(
                matches!(parse_http_addr(bad), Err(ServeError::NotLoopback(_))),
                "{bad}"
            );
        }
        assert_eq!(
            parse_http_addr("example.com:80").map_err(|e| e.to_string()),
            Err(
                "--http \"example.com:80\": only IP addresses and localhost are accepted (a \
                 name may resolve to another machine); use 127.0.0.1:PORT (or [::1]:PORT, \
                 localhost:PORT)"
                    .to_string()
            )
        );
        for bad in ["", "8080", "127.0.0.1", "localhost:x", ":80"] {
            assert!(
                matches!(parse_http_addr(bad), Err(ServeError::BadAddress(_))),
                "{bad}"
            );
        }
    }
}
