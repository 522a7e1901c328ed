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

use super::agent::{checked_agent_binary, AgentClient, AgentLaunch};
use super::process::group_wrapper;
use super::Site;
use super::{
    random_hex, shell_quote, BackendSettings, Channel, CommandOutput, EnvError, Environment,
    ExecSpec, GroupSignal, Spawned,
};
use serde_json::{json, Value};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use stream::{demux, stream_logs, DaytonaProcess, Input};

mod api;
mod gc;
mod stream;

pub use api::Credentials;
use api::{message, Api};
pub use gc::gc;

/// The public service the official SDK talks to when `DAYTONA_API_URL` is not set.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";

const BACKEND: &str = "daytona";
/// Control-plane and toolbox requests (not commands, which have their own limits).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest file `download` takes from a sandbox: the answer is held in memory, and an
/// endless one must not take the host's.
const MAX_DOWNLOAD_BYTES: usize = 1 << 30;
/// How long a sandbox may take to reach `started` (an image build included).
const START_TIMEOUT: Duration = Duration::from_secs(600);

fn err(what: impl Into<String>, message: impl Into<String>) -> EnvError {
    EnvError::Command {
        backend: BACKEND,
        what: what.into(),
        message: message.into(),
    }
}

/// doctor: whether the service answers with these credentials (lists this product's sandboxes).
pub fn probe() -> Result<String, EnvError> {
    let api = Api::new(Credentials::from_env()?)?;
    let n = gc::list_ours(&api)?.len();
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
    site: Site,
    agent: AgentClient,
}

/// An answer of the service as it came, at most 300 characters (a body that was not JSON is
/// kept as a string by [`Api::request`], and shown without JSON quoting).
fn shown(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.chars().take(300).collect()
}

fn gib(mb: Option<u64>) -> Option<u64> {
    mb.map(|m| m.div_ceil(1024).max(1))
}

impl Inner {
    fn labels(&self) -> Value {
        let mut labels = super::owner::cloud_labels(&self.task, self.persistent);
        labels[super::shape::SHAPE_LABEL] = Value::from(self.shape());
        labels
    }

    /// What the sandbox is made from, as its [`super::shape::SHAPE_LABEL`]: the image and the
    /// resources as the service is asked for them (whole CPUs and GiB), and the interpreter.
    fn shape(&self) -> String {
        json!({
            "image": self.image,
            "cpu": self.cpu.map(|c| c.ceil() as u64),
            "memory_gib": gib(self.memory_mb),
            "disk_gib": gib(self.disk_mb),
            "python": self.python,
        })
        .to_string()
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
            // No such endpoint: the URL is wrong, not the sandbox's settings.
            let hint = if status == 404 || status == 405 {
                format!(
                    "the service has no sandbox endpoint at {}; check DAYTONA_API_URL (the API \
                     address, usually ending in /api)",
                    self.api.creds.api_url
                )
            } else if status == 429 {
                // A quota or rate limit: nothing in the settings is wrong.
                "the service refuses more sandboxes or requests for now (a quota or rate \
                 limit); retry later, or remove sandboxes you no longer need"
                    .to_string()
            } else if status >= 500 {
                format!(
                    "the service failed on its side; retry later, and check that \
                     DAYTONA_API_URL ({}) is the Daytona API",
                    self.api.creds.api_url
                )
            } else {
                "check terminal.daytona_image and terminal.container_cpu/memory/disk".to_string()
            };
            return Err(err(
                format!("creating sandbox {}", self.name),
                format!("HTTP {status}: {}; {hint}", message(&v)),
            ));
        }
        self.wait_started(v)
    }

    /// Waits (backing off, this is the control plane, not a command) until `started`.
    fn wait_started(&self, mut v: Value) -> Result<SandboxRef, EnvError> {
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        let mut pause = Duration::from_millis(100);
        loop {
            // An answer without a sandbox's string id and state (a truncated body, a proxy's
            // page, another API at DAYTONA_API_URL) is an error now: polling it was unbounded
            // in practice and reported nothing.
            let (Some(id), Some(state)) = (
                v.get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                    .map(str::to_string),
                v.get("state").and_then(Value::as_str),
            ) else {
                return Err(err(
                    format!("starting sandbox {}", self.name),
                    format!(
                        "the service's answer is not a sandbox (it needs a string id and \
                         state): {}; check DAYTONA_API_URL ({}): it must be the Daytona API \
                         address, usually ending in /api",
                        shown(&v),
                        self.api.creds.api_url
                    ),
                ));
            };
            match state {
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
                // Resumed under settings that changed, it would run the old image with the old
                // resources and say nothing (docs/backends.md, persistent environments).
                let made_from = v
                    .get("labels")
                    .and_then(|l| l.get(super::shape::SHAPE_LABEL))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let changed = super::shape::change(made_from, &self.shape(), |key| match key {
                    "image" => "terminal.daytona_image",
                    "cpu" => "terminal.container_cpu",
                    "memory_gib" => "terminal.container_memory",
                    "disk_gib" => "terminal.container_disk",
                    "python" => "terminal.python",
                    other => other,
                });
                if let Some(changed) = changed {
                    return Err(err(
                        format!("resuming the persistent sandbox {}", self.name),
                        format!(
                            "it was made with other settings ({changed}); making it again would \
                             lose what is in it, so it is left as it is. Remove it (`vibeos-exec \
                             backends gc --all`) to have it made from the current settings, or \
                             restore them"
                        ),
                    ));
                }
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
                    Ok(r) => api::body_capped(r, api::MAX_ANSWER_BYTES)
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok())
                        .unwrap_or(Value::Null),
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

impl DaytonaEnv {
    /// Starts (or, with `container_persistent`, resumes) the sandbox of `task`.
    pub fn start(settings: &BackendSettings, task: &str) -> Result<DaytonaEnv, EnvError> {
        let api = Api::new(Credentials::from_env()?)?;
        // Before the sandbox exists: a failure after it would leave one behind.
        let binary = checked_agent_binary(BACKEND, settings.agent_binary.as_deref())?;
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
        // Until the environment exists, a failure stops (or deletes) what was just created.
        let mut guard = StartGuard(Some(Arc::clone(&inner)));
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
        guard.0 = None;
        Ok(DaytonaEnv {
            site: Site {
                workdir,
                python: inner.python.clone(),
            },
            inner,
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
            Ok(r) => {
                let status = r.status().as_u16();
                let body = api::body_capped(r, api::MAX_ANSWER_BYTES)
                    .await
                    .unwrap_or_else(|e| e.into_bytes());
                Ok((status, String::from_utf8_lossy(&body).into_owned()))
            }
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
    fn fresh_runner(&self) -> Option<super::FreshRun> {
        // One `/process/execute`: the toolbox daemon starts it, no process of the sandbox's
        // executions is in the way.
        let inner = Arc::clone(&self.inner);
        Some(Arc::new(move |argv: &[String]| {
            let line = super::process::shell_line(argv);
            inner.execute(&line, Duration::from_secs(30)).map(|_| ())
        }))
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn isolated(&self) -> bool {
        true
    }

    fn site(&self) -> &Site {
        &self.site
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
            let body = api::body_capped(r, MAX_DOWNLOAD_BYTES).await?;
            Ok::<(u16, Vec<u8>), String>((status, body))
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
        self.inner.release();
    }
}

/// Releases the sandbox of a start that failed after creating it (unless disarmed): without
/// it every failed start (a tool agent that cannot be found, a toolbox error) left a running
/// sandbox behind, which only `backends gc` removed.
struct StartGuard(Option<Arc<Inner>>);

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.release();
        }
    }
}

impl Inner {
    /// Stops (persistent) or deletes the sandbox at the service.
    fn release(&self) {
        let sb = self.current();
        let (method, path) = if self.persistent {
            (reqwest::Method::POST, format!("/sandbox/{}/stop", sb.id))
        } else {
            (reqwest::Method::DELETE, format!("/sandbox/{}", sb.id))
        };
        match self.api.control(method, &path, None) {
            Ok((s, _)) if (200..300).contains(&s) || s == 404 => {
                tracing::info!(sandbox = %sb.id, "backends: daytona sandbox {}", if self.persistent { "stopped" } else { "deleted" })
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
mod tests;
