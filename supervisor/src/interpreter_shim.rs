//! Resolving a `#!` wrapper interpreter (a pyenv shim) to the real executable, for strict mode.
//!
//! Strict mode confines the script before `exec`, and a wrapper script would need its own
//! interpreter (bash), `pyenv` itself and its config inside the sandbox. Rather than make users
//! find and configure the real executable, the supervisor asks the wrapper once, outside the
//! sandbox, which Python it ends up running (`sys.executable`) and runs that directly. The answer
//! depends on what pyenv consults (the cwd's `.python-version`, `PYENV_VERSION`), so the cache is
//! keyed by those; asking costs one interpreter start, paid once per key per process.
//!
//! Chosen over reading pyenv's files ourselves: pyenv's version selection has many sources
//! (`PYENV_VERSION`, local files up the tree, global file, system), and other wrappers (asdf,
//! mise, hand-written ones) follow other rules; running the wrapper gets every one of them right.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

type Key = (PathBuf, Option<PathBuf>, Option<OsString>);

static CACHE: LazyLock<Mutex<HashMap<Key, PathBuf>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// How long the wrapper may take to report its interpreter.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether `path` is a `#!` script rather than a binary.
pub fn is_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == b"#!"
}

/// The real interpreter behind the wrapper `path`, asked once per (wrapper, cwd,
/// `PYENV_VERSION`) and cached. `Err` says why it could not be found; the caller keeps the
/// wrapper, which strict mode then refuses with its own explanation.
pub fn real_interpreter(path: &Path) -> Result<PathBuf, String> {
    let key: Key = (
        path.to_path_buf(),
        std::env::current_dir().ok(),
        std::env::var_os("PYENV_VERSION"),
    );
    if let Some(hit) = CACHE.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(hit.clone());
    }
    let real = probe(path)?;
    if is_script(&real) {
        return Err(format!(
            "it reports {} as its interpreter, which is a #! script too",
            real.display()
        ));
    }
    CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, real.clone());
    Ok(real)
}

fn probe(path: &Path) -> Result<PathBuf, String> {
    let mut child = std::process::Command::new(path)
        .args(["-I", "-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("it cannot be started: {e}"))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                return Err(format!("asking it for sys.executable failed ({status})"))
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "it did not report sys.executable within {} s",
                    PROBE_TIMEOUT.as_secs()
                ));
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    let real = PathBuf::from(out.trim());
    if !real.is_absolute() || !real.is_file() {
        return Err(format!(
            "it reported {:?} as sys.executable, which is not an executable file",
            out.trim()
        ));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapper_resolves_to_the_binary_it_runs_and_is_cached() {
        let Ok(python) = which::which("python3") else {
            eprintln!("SKIP: no python3 on PATH");
            return;
        };
        let real = match real_interpreter(&python) {
            Ok(r) => r,
            Err(e) => panic!("python3 on PATH did not resolve: {e}"),
        };
        assert!(!is_script(&real), "{} is a script", real.display());
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shim = dir.path().join("python3");
        std::fs::write(
            &shim,
            format!("#!/bin/sh\nexec {} \"$@\"\n", real.display()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(is_script(&shim));
        assert_eq!(real_interpreter(&shim).ok(), Some(real.clone()));
        // Cached: the wrapper is not asked again (it is gone, and the answer still comes).
        std::fs::remove_file(&shim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(real_interpreter(&shim).ok(), Some(real));
    }
}
