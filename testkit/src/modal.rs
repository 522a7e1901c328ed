//! The Modal stand-in (tests/standins/modal_server.py) for tests and benchmarks: started with
//! the test venv's Python (which holds the pinned official `modal` SDK, whose wheel ships the
//! gRPC server bases the stand-in is built on) against a private dockerd, stopped by its pid on
//! drop. Without the venv, the SDK or docker, a test reports SKIP with the reason (a failure
//! with `CI=true`).

use crate::backends::Dockerd;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `modal` version the stand-in and the conformance test are pinned to (scripts/test-all
/// installs it into target/pyvenv).
pub const MODAL_VERSION: &str = "1.6.4";

/// The token pair the stand-in accepts.
pub const TOKEN_ID: &str = "ak-vibeos-standin";
/// See [`TOKEN_ID`].
pub const TOKEN_SECRET: &str = "as-vibeos-standin-secret-4c1d";

/// The test venv's interpreter, if it holds the pinned SDK.
pub fn sdk_python() -> Result<PathBuf, String> {
    let python = crate::workspace_root().join("target/pyvenv/bin/python");
    if !python.exists() {
        return Err(format!(
            "{} is missing: scripts/test-all creates it",
            python.display()
        ));
    }
    let out = Command::new(&python)
        .args(["-c", "import modal; print(modal.__version__)"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if version != MODAL_VERSION {
        return Err(format!(
            "target/pyvenv has modal {version:?}, not the pinned {MODAL_VERSION}: run scripts/test-all (it installs modal=={MODAL_VERSION})"
        ));
    }
    Ok(python)
}

/// A running stand-in.
pub struct ModalStandin {
    /// `MODAL_SERVER_URL` for it.
    pub url: String,
    /// The test-hook file: append `expire SANDBOX_ID` or `expire-all` to end sandboxes.
    pub control: PathBuf,
    /// Its stderr log.
    pub log: PathBuf,
    child: Child,
}

impl ModalStandin {
    /// Starts it on a free port against `daemon`.
    pub fn start(python: &std::path::Path, daemon: &Dockerd) -> Result<ModalStandin, String> {
        let server = crate::workspace_root().join("tests/standins/modal_server.py");
        let control = daemon.dir.path().join("modal-control");
        let log = daemon.dir.path().join("modal-standin.log");
        std::fs::write(&control, "").map_err(|e| e.to_string())?;
        let mut child = Command::new(python)
            .arg(&server)
            .args(["--docker-host", &daemon.host])
            .args(["--token-id", TOKEN_ID, "--token-secret", TOKEN_SECRET])
            .arg("--control")
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start the Modal stand-in: {e}"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let Some(port) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the Modal stand-in did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        };
        Ok(ModalStandin {
            url: format!("http://127.0.0.1:{port}"),
            control,
            log,
            child,
        })
    }

    /// The variables the official SDK (and the modal backend) read to reach it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MODAL_SERVER_URL", self.url.clone()),
            ("MODAL_TOKEN_ID", TOKEN_ID.into()),
            ("MODAL_TOKEN_SECRET", TOKEN_SECRET.into()),
            ("MODAL_SANDBOX_V2", "0".into()),
        ]
    }

    /// Appends a test-hook line (`expire SANDBOX_ID`, `expire-all`).
    pub fn control(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.control) {
            let _ = writeln!(f, "{line}");
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A private dockerd with the python3 image as `image`, and the stand-in on it: what every
/// test and benchmark of the modal backend starts from. The stand-in goes first on drop.
pub struct ModalLab {
    /// The stand-in.
    pub standin: ModalStandin,
    /// Its dockerd (each sandbox is a container labelled `modal-standin` there).
    pub dockerd: Dockerd,
    /// The venv's interpreter with the pinned SDK (`terminal.modal_python`).
    pub python: PathBuf,
}

impl ModalLab {
    /// Starts both, or says what is missing (the venv with the SDK, docker, the image).
    pub fn start(image: &str) -> Result<ModalLab, String> {
        let python = sdk_python()?;
        let dockerd = Dockerd::with_python_image(image)?;
        let standin = ModalStandin::start(&python, &dockerd)?;
        Ok(ModalLab {
            standin,
            dockerd,
            python,
        })
    }

    /// The containers of the running sandboxes.
    pub fn sandboxes(&self) -> Vec<String> {
        self.dockerd.running_with_label("modal-standin")
    }

    /// Makes the stand-in the Modal endpoint of this process (see [`crate::export_env`]).
    pub fn export(&self) -> crate::ExportedEnv {
        crate::export_env(self.standin.env())
    }
}

impl Drop for ModalStandin {
    fn drop(&mut self) {
        // SAFETY: kill with our own child's pid, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}
