//! The service's two HTTP faces (control plane and the sandbox's toolbox) behind one client
//! with its own runtime, and the credentials it carries. Only this process reads them.

use super::{err, BACKEND, DEFAULT_API_URL, REQUEST_TIMEOUT};
use crate::environments::EnvError;
use serde_json::Value;
use std::time::Duration;

/// The service's address and credentials, from this process's environment.
#[derive(Clone)]
pub struct Credentials {
    /// `DAYTONA_API_URL` (control plane), without a trailing slash.
    pub api_url: String,
    /// `DAYTONA_API_KEY`.
    pub api_key: String,
}

impl Credentials {
    /// Reads `DAYTONA_API_KEY` and `DAYTONA_API_URL` (default [`DEFAULT_API_URL`]).
    pub fn from_env() -> Result<Credentials, EnvError> {
        let api_key = std::env::var("DAYTONA_API_KEY")
            .ok()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| EnvError::Unreachable {
                backend: BACKEND,
                message:
                    "DAYTONA_API_KEY is not set; export the API key of your Daytona organization"
                        .into(),
            })?;
        let api_url = std::env::var("DAYTONA_API_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_API_URL.into());
        Ok(Credentials {
            api_url: api_url.trim_end_matches('/').to_string(),
            api_key,
        })
    }
}

/// An HTTP client with its own runtime, so the synchronous [`Environment`] methods can be
/// called from any thread (a tool handler, a blocking task, a test).
pub(super) struct Api {
    pub(super) creds: Credentials,
    pub(super) http: reqwest::Client,
    pub(super) rt: tokio::runtime::Runtime,
}

impl Api {
    pub(super) fn new(creds: Credentials) -> Result<Api, EnvError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| err("building the HTTP client", e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vibeos-daytona")
            .enable_all()
            .build()
            .map_err(|e| err("starting the HTTP runtime", e.to_string()))?;
        Ok(Api { creds, http, rt })
    }

    /// Runs `fut` on the client's runtime and waits for it, from any thread.
    pub(super) fn block<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, EnvError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| err("an API request", "the HTTP runtime stopped"))
    }

    /// One JSON request; `Ok((status, body))` for any HTTP answer.
    pub(super) fn request(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<(u16, Value), EnvError> {
        let mut req = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.creds.api_key)
            .timeout(timeout);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let what = format!("{method} {url}");
        let base = self.creds.api_url.clone();
        self.block(async move {
            let resp = req.send().await.map_err(|e| {
                if e.is_timeout() {
                    // Named like the unreachable case: a service that accepts connections and
                    // never answers is as often a wrong DAYTONA_API_URL as a slow service.
                    EnvError::Unreachable {
                        backend: BACKEND,
                        message: format!(
                            "{what} got no answer within {}s; check DAYTONA_API_URL ({base}) and that the service responds",
                            timeout.as_secs()
                        ),
                    }
                } else {
                    EnvError::Unreachable {
                        backend: BACKEND,
                        message: format!(
                            "{what}: {e}; check DAYTONA_API_URL ({base}) and the network"
                        ),
                    }
                }
            })?;
            let status = resp.status().as_u16();
            let bytes = body_capped(resp, MAX_ANSWER_BYTES).await.map_err(|e| {
                err(
                    what.clone(),
                    format!("{e}; check DAYTONA_API_URL ({base}) names the Daytona API"),
                )
            })?;
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Ok((status, value))
        })?
    }

    pub(super) fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), EnvError> {
        let url = format!("{}{path}", self.creds.api_url);
        let (status, value) = self.request(method, url, body, REQUEST_TIMEOUT)?;
        if status == 401 || status == 403 {
            return Err(EnvError::Refused {
                backend: BACKEND,
                message: format!(
                    "HTTP {status} from {} ({}); check DAYTONA_API_KEY (and that DAYTONA_API_URL is your organization's API)",
                    self.creds.api_url,
                    message(&value)
                ),
            });
        }
        Ok((status, value))
    }
}

/// The most of one control-plane or toolbox answer read (a sandbox's JSON is a few KB): the
/// answer was read whole, and a service (or a toolbox URL it handed out) that sent an endless
/// body took the host to 20 GB before the request's timeout ended it.
pub(super) const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The body of `resp`, or why not: at most `cap` bytes are read, and a longer body is an error
/// as soon as it shows (its announced length, or the bytes read so far).
pub(super) async fn body_capped(
    mut resp: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, String> {
    let too_long = || format!("the answer is longer than {} MiB, the most read", cap >> 20);
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_long());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > cap {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

pub(super) fn message(v: &Value) -> String {
    v.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string().chars().take(300).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The error of one request to `path` of the service at `base`.
    fn failed_request(base: &str, method: reqwest::Method, timeout: Duration) -> String {
        let api = Api::new(Credentials {
            api_url: base.to_string(),
            api_key: "k".into(),
        })
        .unwrap();
        api.request(method, format!("{base}/sandbox"), None, timeout)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_service_that_never_answers_is_named_by_its_variable() {
        // Listening, never accepting: the connection is made and the request never answered.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", silent.local_addr().unwrap());
        let e = failed_request(&base, reqwest::Method::POST, Duration::from_millis(300));
        assert!(e.contains("DAYTONA_API_URL") && e.contains(&base), "{e}");
        assert!(e.contains("no answer"), "{e}");
    }

    /// An endless answer (no length, 1 MiB after 1 MiB) is refused once it passes the cap:
    /// read whole, it took the host to 20 GB before the request's timeout ended it.
    #[test]
    fn an_endless_answer_is_refused_at_the_cap() {
        use std::io::{Read, Write};
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", server.local_addr().unwrap());
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&sent);
        std::thread::spawn(move || {
            let (mut conn, _) = server.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n[",
            );
            let chunk = vec![b'a'; 1 << 20];
            // Stops when the client hangs up, or after 256 MiB.
            for _ in 0..256 {
                if conn.write_all(&chunk).is_err() {
                    return;
                }
                counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
            }
        });
        let e = failed_request(&base, reqwest::Method::GET, Duration::from_secs(60));
        assert!(e.contains("longer than 16 MiB"), "{e}");
        assert!(e.contains("DAYTONA_API_URL"), "{e}");
        let sent = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!(sent < 128 << 20, "read {sent} bytes of an endless answer");
    }
}
