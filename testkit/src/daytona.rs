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
        .unwrap_or_else(|| crate::workspace_root().join("target/pyvenv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import daytona, aiohttp"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "{} with the `daytona` SDK (run scripts/test-all to create the venv)",
            py.display()
        ))
    }
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
