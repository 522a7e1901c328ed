//! The daytona backend: one Daytona sandbox per task, driven through the service's REST API
//! (control plane + the sandbox's toolbox). See docs/backends.md, "daytona".
//!
//! Nothing can be mounted into or forwarded to a cloud sandbox, so every byte goes through the
//! API: commands are session commands whose output streams over the toolbox's log websocket
//! (`?follow=true`, stdout/stderr framed by the `\x01\x01\x01`/`\x02\x02\x02` markers) and whose
//! stdin is the "send input" call; files go through the file endpoints; execute_code's RPC
//! rides on [`super::relay`] over one such command; the tool agent is uploaded once and talks
//! JSON lines over another. The API key is read here, from this process's environment, and is
//! sent only to the service: it is never part of anything started in the sandbox.

use super::agent::{agent_binary, AgentClient, AgentLaunch};
use super::process::{group_kill, group_wrapper};
use super::{
    random_hex, shell_quote, BackendSettings, Channel, CommandOutput, EnvError, Environment,
    ExecSpec, GroupSignal, Process, Spawned,
};
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The public service the official SDK talks to when `DAYTONA_API_URL` is not set.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";

const BACKEND: &str = "daytona";
/// Control-plane and toolbox requests (not commands, which have their own limits).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a sandbox may take to reach `started` (an image build included).
const START_TIMEOUT: Duration = Duration::from_secs(600);

fn err(what: impl Into<String>, message: impl Into<String>) -> EnvError {
    EnvError::Command {
        backend: BACKEND,
        what: what.into(),
        message: message.into(),
    }
}

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
struct Api {
    creds: Credentials,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl Api {
    fn new(creds: Credentials) -> Result<Api, EnvError> {
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
    fn block<T: Send + 'static>(
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
    fn request(
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
                    EnvError::Timeout {
                        backend: BACKEND,
                        what: what.clone(),
                        seconds: timeout.as_secs(),
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
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| err(what.clone(), e.to_string()))?;
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Ok((status, value))
        })?
    }

    fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), EnvError> {
        let url = format!("{}{path}", self.creds.api_url);
        let (status, value) = self.request(method, url, body, REQUEST_TIMEOUT)?;
        if status == 401 || status == 403 {
            return Err(EnvError::Unreachable {
                backend: BACKEND,
                message: format!(
                    "the service refused DAYTONA_API_KEY (HTTP {status}): {}",
                    message(&value)
                ),
            });
        }
        Ok((status, value))
    }
}

fn message(v: &Value) -> String {
    v.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string().chars().take(300).collect())
}

/// doctor: whether the service answers with these credentials (lists this product's sandboxes).
pub fn probe() -> Result<String, EnvError> {
    let api = Api::new(Credentials::from_env()?)?;
    let (status, v) = api.control(
        reqwest::Method::GET,
        "/sandbox?labels=%7B%22vibeos-exec%22%3A%221%22%7D",
        None,
    )?;
    if status != 200 {
        return Err(err(
            "listing sandboxes",
            format!("HTTP {status}: {}", message(&v)),
        ));
    }
    let n = v.as_array().map(Vec::len).unwrap_or(0);
    Ok(format!(
        "{} answers, {n} vibeos-exec sandbox(es)",
        api.creds.api_url
    ))
}

/// The sandbox in use: it changes when an expired one is recreated.
#[derive(Clone)]
struct SandboxRef {
    id: String,
    toolbox: String,
}

struct Inner {
    api: Api,
    name: String,
    task: String,
    persistent: bool,
    image: Option<String>,
    cpu: Option<f64>,
    memory_mb: Option<u64>,
    disk_mb: Option<u64>,
    python: String,
    sandbox: Mutex<SandboxRef>,
    recreated: std::sync::atomic::AtomicBool,
    /// A relay started ahead of the next execution (see [`Inner::relay`]).
    warm: Mutex<Option<Spawned>>,
    /// Set by [`Environment::stop`]: nothing may start (or restart) the sandbox after it.
    stopped: std::sync::atomic::AtomicBool,
}

/// One Daytona sandbox (see the module doc).
pub struct DaytonaEnv {
    inner: Arc<Inner>,
    workdir: String,
    agent: AgentClient,
}

fn gib(mb: Option<u64>) -> Option<u64> {
    mb.map(|m| m.div_ceil(1024).max(1))
}

impl Inner {
    fn labels(&self) -> Value {
        json!({
            "vibeos-exec": "1",
            "vibeos-exec.task": self.task,
            "vibeos-exec.persistent": if self.persistent { "1" } else { "0" },
        })
    }

    fn create(&self) -> Result<SandboxRef, EnvError> {
        let mut body = json!({
            "name": self.name,
            "labels": self.labels(),
            "env": {},
            "autoStopInterval": 0,
        });
        if let Some(image) = &self.image {
            body["buildInfo"] =
                json!({ "dockerfileContent": format!("FROM {image}\n"), "contextHashes": [] });
        }
        if let Some(cpu) = self.cpu {
            body["cpu"] = json!(cpu.ceil() as u64);
        }
        if let Some(m) = gib(self.memory_mb) {
            body["memory"] = json!(m);
        }
        if let Some(d) = gib(self.disk_mb) {
            body["disk"] = json!(d);
        }
        let (status, v) = self
            .api
            .control(reqwest::Method::POST, "/sandbox", Some(body))?;
        if !(200..300).contains(&status) {
            return Err(err(
                format!("creating sandbox {}", self.name),
                format!(
                    "HTTP {status}: {}; check terminal.daytona_image",
                    message(&v)
                ),
            ));
        }
        self.wait_started(v)
    }

    /// Waits (backing off, this is the control plane, not a command) until `started`.
    fn wait_started(&self, mut v: Value) -> Result<SandboxRef, EnvError> {
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        let mut pause = Duration::from_millis(100);
        loop {
            let id = v
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            match v.get("state").and_then(Value::as_str).unwrap_or_default() {
                "started" => {
                    let proxy = v
                        .get("toolboxProxyUrl")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            err("reading the sandbox", "the service sent no toolboxProxyUrl")
                        })?;
                    return Ok(SandboxRef {
                        toolbox: format!("{}/{id}", proxy.trim_end_matches('/')),
                        id,
                    });
                }
                "error" | "build_failed" | "destroyed" | "destroying" => {
                    return Err(err(
                        format!("starting sandbox {}", self.name),
                        format!(
                            "it is {}: {}",
                            v["state"],
                            v.get("errorReason")
                                .and_then(Value::as_str)
                                .unwrap_or("no reason given")
                        ),
                    ))
                }
                "stopped" | "archived" => {
                    let (status, started) = self.api.control(
                        reqwest::Method::POST,
                        &format!("/sandbox/{id}/start"),
                        None,
                    )?;
                    if !(200..300).contains(&status) {
                        return Err(err(
                            format!("starting sandbox {}", self.name),
                            message(&started),
                        ));
                    }
                    v = started;
                    continue;
                }
                _ => {}
            }
            if std::time::Instant::now() > deadline {
                return Err(EnvError::Timeout {
                    backend: BACKEND,
                    what: format!("starting sandbox {}", self.name),
                    seconds: START_TIMEOUT.as_secs(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(2));
            let (_, next) =
                self.api
                    .control(reqwest::Method::GET, &format!("/sandbox/{id}"), None)?;
            v = next;
        }
    }

    /// The persistent sandbox of this task if it exists (started), else a new one.
    fn resume_or_create(&self) -> Result<SandboxRef, EnvError> {
        if self.persistent {
            let (status, v) = self.api.control(
                reqwest::Method::GET,
                &format!("/sandbox/{}", self.name),
                None,
            )?;
            if status == 200 {
                tracing::info!(sandbox = %self.name, "backends: resuming the daytona sandbox of this task");
                return self.wait_started(v);
            }
        }
        self.create()
    }

    fn current(&self) -> SandboxRef {
        self.sandbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a toolbox call found the sandbox gone: recreate it, once per environment.
    fn recover(&self, why: &str) -> Result<SandboxRef, EnvError> {
        use std::sync::atomic::Ordering;
        let old = self.current();
        if self.stopped.load(Ordering::SeqCst) {
            return Err(err(
                "reaching the sandbox",
                format!("sandbox {} was stopped ({why})", old.id),
            ));
        }
        let (status, v) =
            self.api
                .control(reqwest::Method::GET, &format!("/sandbox/{}", old.id), None)?;
        if status == 200 && v.get("state").and_then(Value::as_str) != Some("destroyed") {
            let fresh = self.wait_started(v)?;
            *self.sandbox.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
            return Ok(fresh);
        }
        if self.recreated.swap(true, Ordering::SeqCst) {
            return Err(err(
                "reaching the sandbox",
                format!(
                    "sandbox {} is gone again ({why}) after it was recreated once; giving up",
                    old.id
                ),
            ));
        }
        tracing::warn!(sandbox = %old.id, "backends: daytona sandbox {} expired or was deleted ({why}); recreating it once", old.id);
        let fresh = self.create()?;
        *self.sandbox.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// A toolbox request; a sandbox that is gone (404, or not started) is recovered once.
    fn toolbox(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<(u16, Value), EnvError> {
        let sb = self.current();
        let (status, v) = self.api.request(
            method.clone(),
            format!("{}{path}", sb.toolbox),
            body.clone(),
            timeout,
        )?;
        let gone = status == 404 && message(&v).to_lowercase().contains("sandbox")
            || status == 400 && message(&v).to_lowercase().contains("not started");
        if !gone {
            return Ok((status, v));
        }
        let sb = self.recover(&message(&v))?;
        self.api
            .request(method, format!("{}{path}", sb.toolbox), body, timeout)
    }

    fn execute(&self, command: &str, timeout: Duration) -> Result<CommandOutput, EnvError> {
        let secs = timeout.as_secs().max(1);
        let (status, v) = self.toolbox(
            reqwest::Method::POST,
            "/process/execute",
            Some(json!({ "command": command, "timeout": secs })),
            timeout + Duration::from_secs(10),
        )?;
        if status == 408 {
            return Err(EnvError::Timeout {
                backend: BACKEND,
                what: command.chars().take(120).collect(),
                seconds: secs,
            });
        }
        if !(200..300).contains(&status) {
            return Err(err(
                format!("running {:.80}", command),
                format!("HTTP {status}: {}", message(&v)),
            ));
        }
        Ok(CommandOutput {
            code: v
                .get("exitCode")
                .or_else(|| v.get("code"))
                .and_then(Value::as_i64)
                .map(|c| c as i32),
            stdout: v
                .get("result")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .as_bytes()
                .to_vec(),
            stderr: Vec::new(),
        })
    }

    fn spawn(self: &Arc<Self>, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check(BACKEND)?;
        let session = format!("vibeos-{}", random_hex(8));
        let pgid_file = format!("/tmp/.vibeos-pgid-{session}");
        let line = group_wrapper(spec, &pgid_file, &self.python);
        let (status, v) = self.toolbox(
            reqwest::Method::POST,
            "/process/session",
            Some(json!({ "sessionId": session })),
            REQUEST_TIMEOUT,
        )?;
        if !(200..300).contains(&status) {
            return Err(err(
                "creating a session",
                format!("HTTP {status}: {}", message(&v)),
            ));
        }
        let (status, v) = self.toolbox(
            reqwest::Method::POST,
            &format!("/process/session/{session}/exec"),
            Some(json!({ "command": line, "runAsync": true, "async": true })),
            REQUEST_TIMEOUT,
        )?;
        let cmd = v.get("cmdId").and_then(Value::as_str).map(str::to_string);
        let Some(cmd) = cmd.filter(|_| (200..300).contains(&status)) else {
            return Err(err(
                format!("starting {:.80}", spec.display()),
                format!("HTTP {status}: {}", message(&v)),
            ));
        };
        let sb = self.current();
        let base = format!("{}/process/session/{session}/command/{cmd}", sb.toolbox);
        let (out_r, out_w) = std::io::pipe().map_err(|e| err("creating a pipe", e.to_string()))?;
        let (err_r, err_w) = std::io::pipe().map_err(|e| err("creating a pipe", e.to_string()))?;
        let process = Arc::new(DaytonaProcess {
            inner: Arc::clone(self),
            pgid_file,
            done: Mutex::new(None),
            changed: Condvar::new(),
        });
        let (chunks_tx, chunks_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || demux(chunks_rx, out_w, err_w));
        let follow = format!("{base}/logs?follow=true");
        let http = self.api.http.clone();
        let key = self.api.creds.api_key.clone();
        let waiter = Arc::clone(&process);
        let status_url = base.clone();
        let session_url = format!("{}/process/session/{session}", sb.toolbox);
        self.api.rt.spawn(async move {
            let streamed = stream_logs(&http, &key, &follow, &chunks_tx).await;
            drop(chunks_tx);
            if let Err(e) = &streamed {
                tracing::warn!("daytona: the command's log stream failed: {e}");
            }
            // The stream ends when the command does; its exit code is then recorded.
            let mut code = None;
            for _ in 0..50 {
                let resp = http.get(&status_url).bearer_auth(&key).send().await;
                let v: Value = match resp {
                    Ok(r) => r.json().await.unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
                if let Some(c) = v.get("exitCode").and_then(Value::as_i64) {
                    code = Some(c as i32);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = http.delete(&session_url).bearer_auth(&key).send().await;
            waiter.finish(
                code.ok_or_else(|| "the command's exit code could not be read".to_string()),
            );
        });
        Ok(Spawned {
            stdin: Some(Box::new(Input {
                inner: Arc::clone(self),
                url: format!("{base}/input"),
                pending: Vec::new(),
            })),
            stdout: Some(Box::new(out_r)),
            stderr: Some(Box::new(err_r)),
            process,
        })
    }
}

impl Inner {
    /// The relay program holds no state until its first frame, so one is kept started ahead:
    /// an execution takes it (saving a session command's start and a Python start-up, most of
    /// a no-op's cost) and the next one is started in the background.
    fn relay(self: &Arc<Self>, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        let warm = self.warm.lock().unwrap_or_else(|p| p.into_inner()).take();
        let ready = warm.filter(|w| matches!(w.process.try_wait(), Ok(None)));
        let spawned = match ready {
            Some(w) => w,
            None => self.spawn(spec)?,
        };
        let inner = Arc::clone(self);
        let spec = spec.clone();
        std::thread::spawn(move || {
            use std::sync::atomic::Ordering;
            if inner.stopped.load(Ordering::SeqCst) {
                return;
            }
            if let Ok(next) = inner.spawn(&spec) {
                if inner.stopped.load(Ordering::SeqCst) {
                    let _ = next.process.kill(GroupSignal::Kill);
                    return;
                }
                let old = inner
                    .warm
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(next);
                if let Some(old) = old {
                    let _ = old.process.kill(GroupSignal::Kill);
                }
            }
        });
        Ok(spawned)
    }
}

/// Follows a session command's log websocket, sending each message's bytes to `chunks`.
async fn stream_logs(
    http: &reqwest::Client,
    key: &str,
    url: &str,
    chunks: &std::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), String> {
    use base64::Engine as _;
    use tokio_tungstenite::tungstenite::{protocol::Role, Message};
    let nonce: [u8; 16] = std::array::from_fn(|i| {
        u8::from_str_radix(&random_hex(16)[i * 2..i * 2 + 2], 16).unwrap_or(0)
    });
    let resp = http
        .get(url)
        .bearer_auth(key)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header(
            "Sec-WebSocket-Key",
            base64::engine::general_purpose::STANDARD.encode(nonce),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status().as_u16() != 101 {
        return Err(format!("HTTP {} instead of a websocket", resp.status()));
    }
    let upgraded = resp.upgrade().await.map_err(|e| e.to_string())?;
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    while let Some(msg) = ws.next().await {
        match msg.map_err(|e| e.to_string())? {
            Message::Binary(b) => {
                let _ = chunks.send(b.to_vec());
            }
            Message::Text(t) => {
                let _ = chunks.send(t.as_bytes().to_vec());
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

const OUT_MARK: &[u8] = b"\x01\x01\x01";
const ERR_MARK: &[u8] = b"\x02\x02\x02";

/// Splits the toolbox's combined log stream into stdout and stderr at its markers (which may
/// straddle messages).
fn demux(
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    mut out: impl std::io::Write,
    mut err: impl std::io::Write,
) {
    let mut to_err = false;
    let mut carry: Vec<u8> = Vec::new();
    while let Ok(chunk) = chunks.recv() {
        carry.extend_from_slice(&chunk);
        let mut start = 0;
        let mut i = 0;
        let mut emit = |to_err: bool, bytes: &[u8]| {
            if !bytes.is_empty() {
                let _ = if to_err {
                    err.write_all(bytes)
                } else {
                    out.write_all(bytes)
                };
            }
        };
        while i < carry.len() {
            if carry[i] == 1 || carry[i] == 2 {
                let rest = &carry[i..];
                let mark = if carry[i] == 1 { OUT_MARK } else { ERR_MARK };
                if rest.len() < mark.len() && mark.starts_with(rest) {
                    break; // maybe a marker cut by the message boundary
                }
                if rest.starts_with(mark) {
                    emit(to_err, &carry[start..i]);
                    to_err = carry[i] == 2;
                    i += mark.len();
                    start = i;
                    continue;
                }
            }
            i += 1;
        }
        emit(to_err, &carry[start..i]);
        carry.drain(..i);
    }
    if !carry.is_empty() {
        let _ = if to_err {
            err.write_all(&carry)
        } else {
            out.write_all(&carry)
        };
    }
}

/// A session command's stdin: each complete line (or flush) is one "send input" call. The
/// toolbox has no way to close a command's stdin, so dropping this sends what is left and
/// nothing more; commands are ended by [`Process::kill`].
struct Input {
    inner: Arc<Inner>,
    url: String,
    pending: Vec<u8>,
}

impl Input {
    fn send(&mut self, upto: usize) -> std::io::Result<()> {
        if upto == 0 {
            return Ok(());
        }
        let data: Vec<u8> = self.pending.drain(..upto).collect();
        let text = String::from_utf8_lossy(&data).into_owned();
        let (status, v) = self
            .inner
            .api
            .request(
                reqwest::Method::POST,
                self.url.clone(),
                Some(json!({ "data": text })),
                REQUEST_TIMEOUT,
            )
            .map_err(std::io::Error::other)?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                format!(
                    "daytona: sending input failed (HTTP {status}): {}",
                    message(&v)
                ),
            ))
        }
    }
}

impl std::io::Write for Input {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if let Some(last) = self.pending.iter().rposition(|b| *b == b'\n') {
            self.send(last + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let n = self.pending.len();
        self.send(n)
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

struct DaytonaProcess {
    inner: Arc<Inner>,
    pgid_file: String,
    done: Mutex<Option<Result<i32, String>>>,
    changed: Condvar,
}

impl DaytonaProcess {
    fn finish(&self, outcome: Result<i32, String>) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.changed.notify_all();
    }

    fn outcome(done: &Option<Result<i32, String>>) -> Option<Result<i32, EnvError>> {
        done.as_ref()
            .map(|r| r.clone().map_err(|m| err("waiting for a command", m)))
    }
}

impl Process for DaytonaProcess {
    fn wait(&self) -> Result<i32, EnvError> {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = Self::outcome(&done) {
                return r;
            }
            done = self.changed.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn try_wait(&self) -> Result<Option<i32>, EnvError> {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        Self::outcome(&done).transpose()
    }

    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError> {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return Ok(());
        }
        self.inner
            .execute(
                &group_kill(&self.pgid_file, signal),
                Duration::from_secs(15),
            )
            .map(|_| ())
    }
}

impl DaytonaEnv {
    /// Starts (or, with `container_persistent`, resumes) the sandbox of `task`.
    pub fn start(settings: &BackendSettings, task: &str) -> Result<DaytonaEnv, EnvError> {
        let api = Api::new(Credentials::from_env()?)?;
        let safe: String = task
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let name = if settings.container_persistent {
            format!("vibeos-{safe}")
        } else {
            format!("vibeos-{safe}-{}", random_hex(4))
        };
        let inner = Inner {
            api,
            name,
            task: task.to_string(),
            persistent: settings.container_persistent,
            image: settings.daytona_image.clone(),
            cpu: settings.container_cpu,
            memory_mb: settings.container_memory,
            disk_mb: settings.container_disk,
            python: settings.python.clone(),
            sandbox: Mutex::new(SandboxRef {
                id: String::new(),
                toolbox: String::new(),
            }),
            recreated: std::sync::atomic::AtomicBool::new(false),
            warm: Mutex::new(None),
            stopped: std::sync::atomic::AtomicBool::new(false),
        };
        let sb = inner.resume_or_create()?;
        tracing::info!(sandbox = %sb.id, name = %inner.name, "backends: daytona sandbox ready");
        *inner.sandbox.lock().unwrap_or_else(|p| p.into_inner()) = sb;
        let inner = Arc::new(inner);
        let workdir = match &settings.cwd {
            Some(cwd) => cwd.clone(),
            None => {
                let (status, v) = inner.toolbox(
                    reqwest::Method::GET,
                    "/user-home-dir",
                    None,
                    REQUEST_TIMEOUT,
                )?;
                v.get("dir")
                    .and_then(Value::as_str)
                    .filter(|_| status == 200)
                    .unwrap_or("/tmp")
                    .to_string()
            }
        };
        let binary =
            agent_binary(settings.agent_binary.as_deref()).map_err(|message| EnvError::Agent {
                backend: BACKEND,
                message,
            })?;
        let shell_session = settings.shell_session;
        let agent_inner = Arc::clone(&inner);
        let agent = AgentClient::new(BACKEND, move || {
            let path = upload_agent(&agent_inner, &binary)?;
            let mut argv = vec![path, "backend-agent".to_string()];
            if !shell_session {
                argv.push("--no-shell-session".into());
            }
            Ok(AgentLaunch {
                process: agent_inner.spawn(&ExecSpec::new(argv))?,
                socket: None,
            })
        });
        Ok(DaytonaEnv {
            inner,
            workdir,
            agent,
        })
    }

    /// One `POST /process/execute` of a shell `command` (output is stdout and stderr combined,
    /// as the service returns it): the cheapest round trip the service offers, which the
    /// benchmarks compare against.
    pub fn execute(&self, command: &str, timeout: Duration) -> Result<CommandOutput, EnvError> {
        self.inner.execute(command, timeout)
    }

    /// The sandbox's id at the service (it changes if an expired sandbox was recreated).
    pub fn sandbox_id(&self) -> String {
        self.inner.current().id
    }
}

/// Uploads the agent binary once per sandbox (a name per size and mtime) and returns its path.
fn upload_agent(inner: &Arc<Inner>, binary: &std::path::Path) -> Result<String, EnvError> {
    let meta = std::fs::metadata(binary)
        .map_err(|e| err(format!("reading {}", binary.display()), e.to_string()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let path = format!("/tmp/vibeos-agent/vibeos-exec-{}-{mtime}", meta.len());
    let there = inner.execute(
        &format!("test -x {}", shell_quote(&path)),
        Duration::from_secs(30),
    )?;
    if there.success() {
        return Ok(path);
    }
    let data = std::fs::read(binary)
        .map_err(|e| err(format!("reading {}", binary.display()), e.to_string()))?;
    upload(inner, &data, &path, 0o755)?;
    Ok(path)
}

fn upload(inner: &Arc<Inner>, data: &[u8], path: &str, mode: u32) -> Result<(), EnvError> {
    let part = format!("{path}.vibeos-part-{}", random_hex(4));
    let sb = inner.current();
    let form = reqwest::multipart::Form::new()
        .text("files[0].path", part.clone())
        .part(
            "files[0].file",
            reqwest::multipart::Part::bytes(data.to_vec()).file_name(part.clone()),
        );
    let req = inner
        .api
        .http
        .post(format!("{}/files/bulk-upload", sb.toolbox))
        .bearer_auth(&inner.api.creds.api_key)
        .timeout(super::TRANSFER_TIMEOUT)
        .multipart(form);
    let status = inner.api.block(async move {
        match req.send().await {
            Ok(r) => Ok((r.status().as_u16(), r.text().await.unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        }
    })?;
    match status {
        Ok((s, _)) if (200..300).contains(&s) => {}
        Ok((s, body)) => {
            return Err(err(
                format!("uploading to {path}"),
                format!("HTTP {s}: {body:.300}"),
            ))
        }
        Err(e) => return Err(err(format!("uploading to {path}"), e)),
    }
    let (p, q) = (shell_quote(&part), shell_quote(path));
    let out = inner.execute(
        &format!("chmod {mode:o} {p} && mv -f {p} {q}"),
        Duration::from_secs(30),
    )?;
    if out.success() {
        Ok(())
    } else {
        Err(err(
            format!("uploading to {path}"),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

impl Environment for DaytonaEnv {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn isolated(&self) -> bool {
        true
    }

    fn workdir(&self) -> String {
        self.workdir.clone()
    }

    fn python(&self) -> String {
        self.inner.python.clone()
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        let plain = spec.cwd.is_none() && spec.env.is_empty();
        if plain && spec.argv == super::relay::relay_argv(&self.inner.python) {
            return self.inner.relay(spec);
        }
        self.inner.spawn(spec)
    }

    fn exec(
        &self,
        spec: &ExecSpec,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<CommandOutput, EnvError> {
        // A session command, not the one-shot endpoint: it keeps stdout and stderr apart and
        // runs in its own group, which a timeout kills. The toolbox cannot close a command's
        // stdin, so the input is uploaded and redirected from (or /dev/null when empty).
        spec.check(BACKEND)?;
        let input = if stdin.is_empty() {
            "/dev/null".to_string()
        } else {
            let path = format!("/tmp/.vibeos-stdin-{}", random_hex(8));
            upload(&self.inner, stdin, &path, 0o600)?;
            path
        };
        let mut argv: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            "f=$0; exec 0<\"$f\" || exit 125; [ \"$f\" = /dev/null ] || rm -f \"$f\"; exec \"$@\""
                .into(),
            input,
        ];
        argv.extend(spec.argv.iter().cloned());
        let wrapped = ExecSpec {
            argv,
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
        };
        let spawned = self.inner.spawn(&wrapped)?;
        super::collect(BACKEND, spawned, b"", timeout, &spec.display())
    }

    fn upload(&self, data: &[u8], path: &str, mode: u32) -> Result<(), EnvError> {
        upload(&self.inner, data, path, mode)
    }

    fn download(&self, path: &str) -> Result<Vec<u8>, EnvError> {
        let sb = self.inner.current();
        let url = reqwest::Url::parse_with_params(
            &format!("{}/files/download", sb.toolbox),
            &[("path", path)],
        )
        .map_err(|e| err(format!("downloading {path}"), e.to_string()))?;
        let req = self
            .inner
            .api
            .http
            .get(url)
            .bearer_auth(&self.inner.api.creds.api_key)
            .timeout(super::TRANSFER_TIMEOUT);
        let got = self.inner.api.block(async move {
            let r = req.send().await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let body = r.bytes().await.map_err(|e| e.to_string())?;
            Ok::<(u16, Vec<u8>), String>((status, body.to_vec()))
        })?;
        match got {
            Ok((200, body)) => Ok(body),
            Ok((s, body)) => Err(err(
                format!("downloading {path}"),
                format!(
                    "HTTP {s}: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(300)
                        .collect::<String>()
                ),
            )),
            Err(e) => Err(err(format!("downloading {path}"), e)),
        }
    }

    fn open_channel(&self, exec_id: &str, _token: &str) -> Result<Channel, EnvError> {
        super::relay::channel(BACKEND, exec_id)
    }

    fn relayed(&self) -> bool {
        true
    }

    fn agent(&self) -> Option<&AgentClient> {
        Some(&self.agent)
    }

    fn stop(&self) {
        self.inner
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.agent.stop();
        let warm = self
            .inner
            .warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = warm {
            let _ = w.process.kill(GroupSignal::Kill);
        }
        let sb = self.inner.current();
        let (method, path) = if self.inner.persistent {
            (reqwest::Method::POST, format!("/sandbox/{}/stop", sb.id))
        } else {
            (reqwest::Method::DELETE, format!("/sandbox/{}", sb.id))
        };
        match self.inner.api.control(method, &path, None) {
            Ok((s, _)) if (200..300).contains(&s) || s == 404 => {
                tracing::info!(sandbox = %sb.id, "backends: daytona sandbox {}", if self.inner.persistent { "stopped" } else { "deleted" })
            }
            Ok((s, v)) => {
                tracing::warn!(sandbox = %sb.id, "backends: cannot stop the daytona sandbox (HTTP {s}): {}", message(&v))
            }
            Err(e) => {
                tracing::warn!(sandbox = %sb.id, "backends: cannot stop the daytona sandbox: {e}")
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> (String, String) {
        let (tx, rx) = std::sync::mpsc::channel();
        for c in chunks {
            tx.send(c.to_vec()).unwrap();
        }
        drop(tx);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        demux(rx, &mut out, &mut err);
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn the_log_stream_splits_at_markers_even_across_messages() {
        assert_eq!(
            split(&[b"\x01\x01\x01out1\x02\x02\x02err1\x01\x01", b"\x01out2"]),
            ("out1out2".into(), "err1".into())
        );
        assert_eq!(split(&[b"plain"]), ("plain".into(), String::new()));
        // A lone \x01 that is not a marker is data.
        assert_eq!(split(&[b"a\x01b"]), ("a\x01b".into(), String::new()));
    }

    #[test]
    fn sizes_round_up_to_whole_gib() {
        assert_eq!(gib(Some(512)), Some(1));
        assert_eq!(gib(Some(4096)), Some(4));
        assert_eq!(gib(Some(5000)), Some(5));
        assert_eq!(gib(None), None);
    }
}
