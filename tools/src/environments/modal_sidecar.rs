//! The host's end of the modal backend's sidecar: one Python process running the official
//! Modal SDK ([`SIDECAR_SOURCE`]), asked for sandbox operations over a private UNIX socket.
//!
//! Why a sidecar: Modal has no Rust SDK, and its gRPC API ships only as compiled descriptors
//! inside the Python wheel, with client-side behaviour (retries, token refresh, the command
//! router, the filesystem helper's JSON protocol) that a second implementation would have to
//! track release by release. The measured cost of the extra local hop is small next to one
//! exec round trip (docs/backends.md, "Modal: sidecar or direct gRPC").
//!
//! The sidecar is started once per process, on first use, with `terminal.modal_python`; it is
//! the only process that sees `MODAL_TOKEN_ID`, `MODAL_TOKEN_SECRET` and `MODAL_SERVER_URL`
//! (the supervisor's environment, passed on to it alone). Each operation is one connection:
//! a JSON request line, a JSON reply line, and for `exec` framed stdio both ways afterwards
//! (see the protocol comment in modal_sidecar.py). Every wait has a deadline, so a sidecar or
//! service that stops answering gives an error naming it instead of a hang.

use super::EnvError;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The sidecar program (needs Python 3.9+ with the `modal` package).
pub const SIDECAR_SOURCE: &str = include_str!("modal_sidecar.py");

/// How long the sidecar may take to import the SDK and listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The prefix of the sidecar's socket dir on this host (see [`super::host_dirs`]).
pub const DIR_PREFIX: &str = "vibeos-modal-";

/// How long a control operation (hello, create, terminate, a file transfer) may take.
pub const OP_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the credential and reachability check may take.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(20);

/// The variables only the sidecar receives.
pub const CREDENTIAL_VARS: [&str; 3] = ["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_SERVER_URL"];

fn err(what: &str, message: impl Into<String>) -> EnvError {
    EnvError::Command {
        backend: "modal",
        what: what.into(),
        message: message.into(),
    }
}

/// A failed reply of the sidecar, as the backend's error: auth and reachability problems name
/// the variables that decide them.
fn reply_error(what: &str, e: &Value) -> EnvError {
    let kind = e.get("kind").and_then(Value::as_str).unwrap_or("other");
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("no message")
        .to_string();
    match kind {
        "auth" => EnvError::Refused {
            backend: "modal",
            message: format!(
                "{what}: {message}; check MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
            ),
        },
        "unreachable" => EnvError::Unreachable {
            backend: "modal",
            message: format!(
                "{what}: cannot reach the Modal API at {} ({message}); check MODAL_SERVER_URL and the network",
                server_url()
            ),
        },
        _ => err(what, message),
    }
}

/// `MODAL_SERVER_URL`, or the SDK's default, for messages.
pub fn server_url() -> String {
    std::env::var("MODAL_SERVER_URL").unwrap_or_else(|_| "the default Modal API".into())
}

/// The running sidecar.
pub struct Sidecar {
    python: String,
    dir: tempfile::TempDir,
    child: Mutex<Child>,
    _lifeline: Mutex<Option<ChildStdin>>,
}

static SIDECAR: OnceLock<Mutex<Option<Arc<Sidecar>>>> = OnceLock::new();

static AT_EXIT: std::sync::Once = std::sync::Once::new();

extern "C" fn stop_at_exit() {
    // Never block on the lock at exit (see `exit_hook`); the sidecar's own stop is bounded.
    if let Some(slot) = SIDECAR.get() {
        if let Ok(mut slot) = slot.try_lock() {
            slot.take();
        }
    }
}

impl Sidecar {
    /// The process's sidecar for `python`, started (or restarted, if it died) on demand.
    pub fn get(python: &str) -> Result<Arc<Sidecar>, EnvError> {
        let slot = SIDECAR.get_or_init(|| Mutex::new(None));
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.as_ref() {
            if s.python == python && s.alive() {
                return Ok(Arc::clone(s));
            }
        }
        let s = Arc::new(Sidecar::start(python)?);
        *slot = Some(Arc::clone(&s));
        // Hosts stop it with `shutdown`; one that never does (a test binary, an embedder) would
        // leave the process and its socket dir behind.
        crate::exit_hook::register(
            &AT_EXIT,
            stop_at_exit,
            "the Modal sidecar's socket dir may be left in TMPDIR at exit",
        );
        Ok(s)
    }

    /// Stops the process's sidecar (host exit).
    pub fn shutdown() {
        if let Some(slot) = SIDECAR.get() {
            slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
    }

    fn alive(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    fn start(python: &str) -> Result<Sidecar, EnvError> {
        let dir = super::host_dirs::private_dir(DIR_PREFIX)
            .map_err(|e| err("creating the sidecar's socket dir", e.to_string()))?;
        let socket = dir.path().join("sidecar.sock");
        let mut cmd = Command::new(python);
        cmd.arg("-u")
            .arg("-c")
            .arg(SIDECAR_SOURCE)
            .arg(&socket)
            // `-c` puts the working dir first on sys.path: in the caller's project dir a
            // `grpclib.py` (or any module the SDK imports) would run inside the process that
            // holds the Modal token. Its own private dir holds nothing importable.
            .current_dir(dir.path())
            // A group of its own: a terminal's Ctrl-C (or `timeout`'s SIGTERM to the group)
            // is for vibeos-exec, which then ends the sandbox through this sidecar; the
            // sidecar itself ends when its stdin (our lifeline) closes.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Only Modal's credentials go to the Modal SDK: the host's other secrets (another
        // service's API key, tokens the scripts never see) have no business there.
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if !text.starts_with("MODAL_") && crate::redact::is_secret_name(&text) {
                cmd.env_remove(&name);
            }
        }
        // Sandbox flow V1 (see docs/backends.md) unless the user chose otherwise.
        if std::env::var_os("MODAL_SANDBOX_V2").is_none() {
            cmd.env("MODAL_SANDBOX_V2", "0");
        }
        let mut child = cmd.spawn().map_err(|source| EnvError::Spawn {
            backend: "modal",
            program: python.to_string(),
            source,
            setting: "terminal.modal_python to a Python 3 interpreter with the `modal` package",
        })?;
        let lifeline = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            if let Some(out) = stdout {
                let mut out = BufReader::new(out);
                let _ = out.read_line(&mut line);
                let _ = tx.send(line);
                // Drain whatever else it prints so it never blocks on a full pipe.
                let mut sink = Vec::new();
                let _ = out.read_to_end(&mut sink);
            }
        });
        let ready = rx.recv_timeout(START_TIMEOUT).unwrap_or_default();
        if ready.trim() != "ready" {
            let _ = child.kill();
            let status = match child.wait().ok().map(|s| (s.code(), s.signal())) {
                Some((Some(code), _)) => format!("it exited with {code}"),
                Some((None, Some(sig))) => format!("it was killed by signal {sig}"),
                _ => format!("it did not say `ready` within {}s", START_TIMEOUT.as_secs()),
            };
            // The sidecar says so itself when `import modal` fails (see modal_sidecar.py):
            // the common mistake, worth a message of its own.
            if let Some(why) = ready.trim().strip_prefix("no-modal ") {
                return Err(err(
                    "starting the Modal SDK sidecar",
                    format!(
                        "`{python}` (terminal.modal_python) has no `modal` package ({why}); install it there (`{python} -m pip install modal`) or set terminal.modal_python to an interpreter that has it"
                    ),
                ));
            }
            return Err(err(
                "starting the Modal SDK sidecar",
                format!(
                    "`{python}` (terminal.modal_python) did not start it ({status}; see the Python error above); set terminal.modal_python to a Python 3 interpreter with the `modal` package (pip install modal)"
                ),
            ));
        }
        Ok(Sidecar {
            python: python.to_string(),
            dir,
            child: Mutex::new(child),
            _lifeline: Mutex::new(lifeline),
        })
    }

    fn connect(&self, timeout: Duration) -> Result<UnixStream, EnvError> {
        let stream = UnixStream::connect(self.dir.path().join("sidecar.sock"))
            .map_err(|e| err("connecting to the Modal SDK sidecar", e.to_string()))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| err("connecting to the Modal SDK sidecar", e.to_string()))?;
        Ok(stream)
    }

    /// One request/reply operation; `body` follows the request line (an upload's bytes).
    /// Returns the `ok` value and, for `read`, the bytes after the reply line.
    pub fn call(
        &self,
        what: &str,
        request: Value,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(Value, Vec<u8>), EnvError> {
        let mut stream = self.connect(timeout)?;
        let mut line = request.to_string();
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .and_then(|_| stream.write_all(body))
            .map_err(|e| err(what, format!("the sidecar went away: {e}")))?;
        let mut reader = BufReader::new(stream);
        let reply = read_reply(&mut reader, what, timeout)?;
        let mut extra = Vec::new();
        if let Some(size) = reply.get("size").and_then(Value::as_u64) {
            extra.resize(size as usize, 0);
            reader
                .read_exact(&mut extra)
                .map_err(|e| err(what, format!("the sidecar's data ended early: {e}")))?;
        }
        Ok((reply, extra))
    }

    /// Starts `argv` in the sandbox; the returned streams carry its stdio.
    pub fn exec(
        &self,
        sandbox_id: &str,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
    ) -> Result<SidecarExec, EnvError> {
        let what = "starting a command in the sandbox";
        // No read deadline once it runs: a command may legitimately be silent for hours; the
        // caller's timeout kills it, which ends the stream.
        let stream = self.connect(OP_TIMEOUT)?;
        let request = json!({
            "op": "exec",
            "sandbox_id": sandbox_id,
            "argv": argv,
            "cwd": cwd,
            "env": env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        });
        let mut w = stream.try_clone().map_err(|e| err(what, e.to_string()))?;
        let mut line = request.to_string();
        line.push('\n');
        w.write_all(line.as_bytes())
            .map_err(|e| err(what, format!("the sidecar went away: {e}")))?;
        let mut reader = BufReader::new(stream);
        read_reply(&mut reader, what, OP_TIMEOUT)?;
        let _ = reader.get_ref().set_read_timeout(None);
        let (out_r, out_w) = std::io::pipe().map_err(|e| err(what, e.to_string()))?;
        let (err_r, err_w) = std::io::pipe().map_err(|e| err(what, e.to_string()))?;
        let exit = Arc::new(ExitCell::default());
        let exit2 = Arc::clone(&exit);
        std::thread::Builder::new()
            .name("vibeos-modal-exec".into())
            .spawn(move || demux(reader, out_w, err_w, &exit2))
            .map_err(|e| err(what, e.to_string()))?;
        Ok(SidecarExec {
            stdin: FrameWriter { stream: Some(w) },
            stdout: out_r,
            stderr: err_r,
            exit,
        })
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // Closing its stdin ends it; wait briefly, then make sure.
        self._lifeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..50 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn read_reply(
    reader: &mut BufReader<UnixStream>,
    what: &str,
    timeout: Duration,
) -> Result<Value, EnvError> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => return Err(err(what, "the Modal SDK sidecar closed the connection")),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(EnvError::Timeout {
                backend: "modal",
                what: format!("{what} (Modal API at {})", server_url()),
                seconds: timeout.as_secs(),
            })
        }
        Err(e) => return Err(err(what, e.to_string())),
    }
    let reply: Value = serde_json::from_str(&line)
        .map_err(|e| err(what, format!("the sidecar answered nonsense ({e}): {line}")))?;
    if let Some(e) = reply.get("err") {
        return Err(reply_error(what, e));
    }
    Ok(reply.get("ok").cloned().unwrap_or(Value::Null))
}

/// The exit code of a sidecar exec, once its `x` frame (or the end of its stream) arrived.
#[derive(Default)]
pub struct ExitCell {
    code: Mutex<Option<i32>>,
    done: Condvar,
}

impl ExitCell {
    fn set(&self, code: i32) {
        let mut c = self.code.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_none() {
            *c = Some(code);
        }
        self.done.notify_all();
    }

    /// Blocks until it ended.
    pub fn wait(&self) -> i32 {
        let mut c = self.code.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(code) = *c {
                return code;
            }
            c = self.done.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The code if it ended.
    pub fn try_get(&self) -> Option<i32> {
        *self.code.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Splits the sidecar's frames into the two output pipes and the exit code. A stream that
/// ends without an exit frame (sidecar gone) reports -1.
fn demux(
    mut reader: BufReader<UnixStream>,
    mut out: std::io::PipeWriter,
    mut errw: std::io::PipeWriter,
    exit: &ExitCell,
) {
    let mut code = -1;
    loop {
        let mut head = [0u8; 5];
        if reader.read_exact(&mut head).is_err() {
            break;
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut data = vec![0u8; len];
        if reader.read_exact(&mut data).is_err() {
            break;
        }
        match head[0] {
            b'o' => {
                let _ = out.write_all(&data);
            }
            b'r' => {
                let _ = errw.write_all(&data);
            }
            b'x' => {
                code = sdk_code(String::from_utf8_lossy(&data).trim().parse().unwrap_or(-1));
                break;
            }
            _ => break,
        }
    }
    drop(out);
    drop(errw);
    exit.set(code);
}

/// The SDK reports a death by signal N as 128+N; callers expect -N, as for local children.
fn sdk_code(code: i32) -> i32 {
    if (129..=192).contains(&code) {
        -(code - 128)
    } else {
        code
    }
}

/// A command started through the sidecar.
pub struct SidecarExec {
    /// Its stdin (framed); dropping it sends EOF.
    pub stdin: FrameWriter,
    /// Its stdout.
    pub stdout: std::io::PipeReader,
    /// Its stderr.
    pub stderr: std::io::PipeReader,
    /// Its exit code, once known.
    pub exit: Arc<ExitCell>,
}

/// Writes stdin frames to the sidecar; EOF is sent on drop.
pub struct FrameWriter {
    stream: Option<UnixStream>,
}

impl Write for FrameWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(s) = self.stream.as_mut() else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        let n = buf.len().min(1 << 20);
        let mut frame = Vec::with_capacity(n + 5);
        frame.push(b'i');
        frame.extend_from_slice(&(n as u32).to_be_bytes());
        frame.extend_from_slice(&buf[..n]);
        s.write_all(&frame)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for FrameWriter {
    fn drop(&mut self) {
        if let Some(mut s) = self.stream.take() {
            let _ = s.write_all(&[b'e', 0, 0, 0, 0]);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn signal_deaths_reported_by_the_sdk_become_negative_codes() {
        assert_eq!(super::sdk_code(137), -9);
        assert_eq!(super::sdk_code(143), -15);
        assert_eq!(super::sdk_code(3), 3);
        assert_eq!(super::sdk_code(-1), -1);
    }
}
