//! The Daytona stand-in (tests/standins/daytona_standin.py) for tests and benchmarks: started
//! with the test venv's Python (which holds aiohttp and the pinned `daytona` SDK) against a
//! private dockerd, so each sandbox is a real container. Stopped (its containers removed) when
//! dropped.

use crate::backends::Dockerd;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The test venv's Python with the `daytona` SDK, or why it cannot be used.
pub fn sdk_python() -> Result<PathBuf, String> {
    let py = std::env::var_os("VIBEOS_TEST_DAYTONA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::target_dir().join("pyvenv/bin/python"));
    crate::python_with(py, "daytona, aiohttp")
}

/// A running stand-in.
pub struct Standin {
    /// Its control-plane URL (`DAYTONA_API_URL`), ending in `/api`.
    pub api_url: String,
    /// The API key it accepts.
    pub api_key: String,
    child: Child,
}

impl Standin {
    /// Starts it against `dockerd`; sandboxes without an image use `default_image`.
    pub fn start(dockerd: &Dockerd, default_image: &str) -> Result<Standin, String> {
        let py = sdk_python()?;
        let api_key = format!("test-key-{}", std::process::id());
        let mut child = Command::new(py)
            .arg(crate::workspace_root().join("tests/standins/daytona_standin.py"))
            .args(["--api-key", &api_key, "--default-image", default_image])
            .env("DOCKER_HOST", &dockerd.host)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the daytona stand-in: {e}"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let base = line.trim().to_string();
        if !base.starts_with("http://") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the daytona stand-in did not start (printed {base:?})"
            ));
        }
        Ok(Standin {
            api_url: format!("{base}/api"),
            api_key,
            child,
        })
    }
}

impl Standin {
    /// The variables the official SDK (and the daytona backend) read to reach it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("DAYTONA_API_URL", self.api_url.clone()),
            ("DAYTONA_API_KEY", self.api_key.clone()),
        ]
    }

    /// Makes it the endpoint of this process (see [`crate::export_env`]).
    pub fn export(&self) -> crate::ExportedEnv {
        crate::export_env(self.env())
    }
}

/// A private dockerd with the python3 image as `image`, and the stand-in on it: what every
/// test and benchmark of the daytona backend starts from. The stand-in goes first on drop.
pub struct DaytonaLab {
    /// The stand-in.
    pub standin: Standin,
    /// Its dockerd (each sandbox is a container labelled `daytona-standin=1` there).
    pub dockerd: Dockerd,
}

impl DaytonaLab {
    /// Starts both, or says what is missing (the venv with the SDK, docker, the image).
    pub fn start(image: &str) -> Result<DaytonaLab, String> {
        sdk_python()?;
        let dockerd = Dockerd::with_python_image(image)?;
        let standin = Standin::start(&dockerd, image)?;
        Ok(DaytonaLab { standin, dockerd })
    }

    /// The containers of the running sandboxes.
    pub fn sandboxes(&self) -> Vec<String> {
        self.dockerd.running_with_label("daytona-standin=1")
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        // Closing its stdin makes it remove its containers and exit.
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
