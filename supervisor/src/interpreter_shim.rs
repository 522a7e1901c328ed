//! Resolving a `#!` wrapper interpreter (a pyenv shim) to the real executable it selects, in
//! both modes (SPEC §3, docs/interpreter.md).
//!
//! A wrapper cannot run confined (strict mode: it would need its own interpreter, `pyenv` and
//! its config inside the sandbox), and run as it is (project mode) it hides what it runs: it
//! adds its own variables (`PYENV_ROOT`, `PYENV_VERSION`…) to the script's environment
//! behind the scrubbing (SPEC §4), the result names it instead of the Python that ran, and
//! the 3.8 check cannot see a `.python-version` that selects a Python 2. So the supervisor
//! asks the wrapper once, outside any sandbox, which Python it ends up running and which
//! version that is (`sys.executable`, `sys.version_info`), and runs that directly. The answer
//! depends on what pyenv consults: the cwd the interpreter runs in (`.python-version` there
//! and above) and `PYENV_VERSION`; so the question runs in the execution's session cwd and the
//! cache is keyed by (wrapper, that cwd, `PYENV_VERSION`). Asking costs one start of the
//! wrapper and its Python, paid once per key per process. A wrapper that cannot say is asked
//! again only after a while, so a run that resolves its interpreter twice (prestart, then
//! execute) waits for a hanging wrapper once. The question runs as every probe does
//! ([`crate::interpreter_probe`]): scrubbed environment, own process group, bounded.
//!
//! Chosen over reading pyenv's files ourselves: pyenv's version selection has many sources
//! (`PYENV_VERSION`, local files up the tree, global file, system), and other wrappers (asdf,
//! mise, hand-written ones) follow other rules; running the wrapper gets every one of them right.

use crate::interpreter_probe::{ask, Isolation, ProbeEnv, ProbeError, PROBE_ANSWER_TTL};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// (wrapper, the cwd it runs in, `PYENV_VERSION`).
type Key = (PathBuf, PathBuf, Option<OsString>);

/// What a wrapper runs: the executable and its Python version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The real executable (`sys.executable`), not a `#!` script.
    pub path: PathBuf,
    /// Its `sys.version_info[:2]`.
    pub version: (u32, u32),
}

/// A wrapper's answer: what it runs (kept for the life of the process), or why it gave none
/// and when (kept for [`PROBE_ANSWER_TTL`]).
#[derive(Clone)]
enum Cached {
    Found(Selected),
    Failed(Instant, String),
}

static CACHE: LazyLock<Mutex<HashMap<Key, Cached>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// How long the wrapper may take to report its interpreter.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether `path` is a `#!` script rather than a binary: one open and a two-byte read, the
/// whole cost of this module for an interpreter that is not a wrapper.
pub fn is_script(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == b"#!"
}

/// What the wrapper `path` runs when started in `cwd`, asked once per (wrapper, `cwd`,
/// `PYENV_VERSION`) and cached; `env` is the caller's environment the question runs with.
/// `Err` says why it could not be found; the caller then keeps the wrapper.
pub fn real_interpreter(path: &Path, cwd: &Path, env: &ProbeEnv) -> Result<Selected, String> {
    let key: Key = (
        path.to_path_buf(),
        cwd.to_path_buf(),
        env.var("PYENV_VERSION"),
    );
    let cache = || CACHE.lock().unwrap_or_else(|p| p.into_inner());
    match cache().get(&key).cloned() {
        Some(Cached::Found(real)) => return Ok(real),
        Some(Cached::Failed(asked, why)) if asked.elapsed() < PROBE_ANSWER_TTL => return Err(why),
        _ => {}
    }
    let answer = probe(path, cwd, env).and_then(|real| {
        if is_script(&real.path) {
            Err(format!(
                "it reports {} as its interpreter, which is a #! script too",
                real.path.display()
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

/// The question: the version first, then the executable (the rest of the output, so a path
/// is taken whole).
const QUESTION: &str = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.executable)";

fn probe(path: &Path, cwd: &Path, env: &ProbeEnv) -> Result<Selected, String> {
    // `-E -s` rather than `-I`: a wrapper that selects a Python 2 must answer, so that the
    // selection is refused as too old instead of run.
    let answer = ask(
        path,
        Isolation::IgnoreEnvAndUserSite,
        QUESTION,
        Some(cwd),
        PROBE_TIMEOUT,
        env,
    )
    .map_err(|e| match e {
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
    parse_answer(&answer.stdout)
}

fn parse_answer(out: &str) -> Result<Selected, String> {
    let (version, exe) = out.split_once('\n').unwrap_or((out, ""));
    let exe = exe.strip_suffix('\n').unwrap_or(exe);
    let version = crate::interpreter_probe::parse_version(version.trim())
        .ok_or_else(|| format!("it reported {:?}, not a Python version", version.trim()))?;
    let real = PathBuf::from(exe);
    if !real.is_absolute() || !real.is_file() {
        return Err(format!(
            "it reported {exe:?} as sys.executable, which is not an executable file"
        ));
    }
    Ok(Selected {
        path: real,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_exe(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn python3() -> Option<PathBuf> {
        let python = which::which("python3").ok()?;
        let out = std::process::Command::new(python)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()?;
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    #[test]
    fn a_wrapper_resolves_to_the_binary_it_runs_and_is_cached() {
        let Some(real) = python3() else {
            eprintln!("SKIP: no python3 on PATH");
            return;
        };
        let env = ProbeEnv::default();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shim = dir.path().join("python3");
        write_exe(
            &shim,
            &format!("#!/bin/sh\nexec {} \"$@\"\n", real.display()),
        );
        assert!(is_script(&shim));
        let found = real_interpreter(&shim, dir.path(), &env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.path, real);
        assert!(found.version >= (3, 0), "{found:?}");
        // Cached: the wrapper is not asked again (it is gone, and the answer still comes).
        std::fs::remove_file(&shim).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(real_interpreter(&shim, dir.path(), &env).ok(), Some(found));
    }

    /// pyenv reads `.python-version` in the cwd the interpreter runs in: the wrapper used to
    /// be asked in this process's cwd (and cached by it), so an execution whose session dir
    /// selected another Python got the one selected where the supervisor was started.
    #[test]
    fn a_wrapper_is_asked_in_the_cwd_the_script_runs_in() {
        let Some(real) = python3() else {
            eprintln!("SKIP: no python3 on PATH");
            return;
        };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // A second name for the same Python, which reports it as its sys.executable.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&real, other.join("python3")).unwrap_or_else(|e| panic!("{e}"));
        let shim = dir.path().join("python3");
        write_exe(
            &shim,
            &format!(
                "#!/bin/sh\nif [ \"$(cat .python-version 2>/dev/null)\" = other ]; then exec {} \"$@\"; fi\nexec {} \"$@\"\n",
                other.join("python3").display(),
                real.display()
            ),
        );
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(project.join(".python-version"), "other\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let env = ProbeEnv::default();
        let selected = |cwd: &Path| real_interpreter(&shim, cwd, &env).map(|s| s.path);
        assert_eq!(selected(&project), Ok(other.join("python3")));
        assert_eq!(selected(dir.path()), Ok(real.clone()));
        // Each answer is kept under its own cwd.
        assert_eq!(selected(&project), Ok(other.join("python3")));
    }

    #[test]
    fn the_answer_is_a_version_then_an_executable() {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let answer = format!("2.7\n{}\n", exe.display());
        assert_eq!(
            parse_answer(&answer),
            Ok(Selected {
                path: exe.clone(),
                version: (2, 7)
            })
        );
        assert!(parse_answer("Python\n").is_err());
        assert!(parse_answer("3.12\nrelative/python\n").is_err());
    }
}
