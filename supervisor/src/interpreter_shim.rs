//! Resolving a `#!` wrapper interpreter (a pyenv shim) to the real executable, for strict mode.
//!
//! Strict mode confines the script before `exec`, and a wrapper script would need its own
//! interpreter (bash), `pyenv` itself and its config inside the sandbox. Rather than make users
//! find and configure the real executable, the supervisor asks the wrapper once, outside the
//! sandbox, which Python it ends up running (`sys.executable`) and runs that directly. The answer
//! depends on what pyenv consults (the cwd's `.python-version`, `PYENV_VERSION`), so the cache is
//! keyed by those; asking costs one interpreter start, paid once per key per process. A wrapper
//! that cannot say is asked again only after a while, so a run that resolves its interpreter
//! twice (prestart, then execute) waits for a hanging wrapper once. The question runs as every
//! probe does ([`crate::interpreter_probe`]): scrubbed environment, own process group, bounded.
//!
//! Chosen over reading pyenv's files ourselves: pyenv's version selection has many sources
//! (`PYENV_VERSION`, local files up the tree, global file, system), and other wrappers (asdf,
//! mise, hand-written ones) follow other rules; running the wrapper gets every one of them right.

use crate::interpreter_probe::{ask, ProbeEnv, ProbeError, PROBE_ANSWER_TTL};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

type Key = (PathBuf, Option<PathBuf>, Option<OsString>);

/// A wrapper's answer: its interpreter (kept for the life of the process), or why it gave none
/// and when (kept for [`PROBE_ANSWER_TTL`]).
#[derive(Clone)]
enum Cached {
    Found(PathBuf),
    Failed(Instant, String),
}

static CACHE: LazyLock<Mutex<HashMap<Key, Cached>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

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
/// `PYENV_VERSION`) and cached; `env` is the caller's environment the question runs with.
/// `Err` says why it could not be found; the caller keeps the wrapper, which strict mode then
/// refuses with its own explanation.
pub fn real_interpreter(path: &Path, env: &ProbeEnv) -> Result<PathBuf, String> {
    let key: Key = (
        path.to_path_buf(),
        std::env::current_dir().ok(),
        env.var("PYENV_VERSION"),
    );
    let cache = || CACHE.lock().unwrap_or_else(|p| p.into_inner());
    match cache().get(&key).cloned() {
        Some(Cached::Found(real)) => return Ok(real),
        Some(Cached::Failed(asked, why)) if asked.elapsed() < PROBE_ANSWER_TTL => return Err(why),
        _ => {}
    }
    let answer = probe(path, env).and_then(|real| {
        if is_script(&real) {
            Err(format!(
                "it reports {} as its interpreter, which is a #! script too",
                real.display()
            ))
        } else {
            Ok(real)
        }
    });
    let entry = match &answer {
        Ok(real) => Cached::Found(real.clone()),
        Err(why) => Cached::Failed(Instant::now(), why.clone()),
    };
    cache().insert(key, entry);
    answer
}

fn probe(path: &Path, env: &ProbeEnv) -> Result<PathBuf, String> {
    let code = "import sys; print(sys.executable)";
    let answer = ask(path, code, PROBE_TIMEOUT, env).map_err(|e| match e {
        ProbeError::TimedOut(t) => {
            format!("it did not report sys.executable within {} s", t.as_secs())
        }
        other => other.to_string(),
    })?;
    if !answer.status.success() {
        return Err(format!(
            "asking it for sys.executable failed ({})",
            answer.status
        ));
    }
    let out = answer.stdout;
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
        let env = ProbeEnv::default();
        let real = match real_interpreter(&python, &env) {
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
        assert_eq!(real_interpreter(&shim, &env).ok(), Some(real.clone()));
        // Cached: the wrapper is not asked again (it is gone, and the answer still comes).
        std::fs::remove_file(&shim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(real_interpreter(&shim, &env).ok(), Some(real));
    }
}
