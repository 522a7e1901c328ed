//! Which Python runs the script (SPEC §3).
//!
//! Project mode prefers the user's active environment (`VIRTUAL_ENV`, then `CONDA_PREFIX`) so
//! `import pandas` works as it does in their shell; anything unusable there (unset, broken,
//! older than 3.8) falls back to the default interpreter, with the reason logged. The version is
//! read from `pyvenv.cfg` or the `lib/pythonX.Y` layout when possible, because starting the
//! interpreter just to ask costs as much as the script itself. The layout is believed only when
//! the executable is what it describes: it resolves into the base interpreter's directory (the
//! cfg's `home`, else the prefix's `bin`) under a name that fits the declared version
//! (`python`, `python3`, `python3.12`). Anything else (`bin/python3 -> /bin/cat`, a cfg saying
//! 3.12 in front of a `python3.6`, a venv made with `--copies`) is asked
//! ([`crate::interpreter_probe`]), and the answer is kept for a while so that the executions of
//! one run ask once.
//!
//! A relative `VIRTUAL_ENV` or `CONDA_PREFIX` is taken relative to this process's cwd (where
//! the shell that set it was), not the session cwd the script runs in.

use crate::config::Mode;
use crate::interpreter_probe::{parse_version, ProbeEnv, PROBE_ANSWER_TTL};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Oldest Python the stub supports.
pub const MIN_VERSION: (u32, u32) = (3, 8);

/// The interpreter chosen for one execution and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Executable to run.
    pub path: PathBuf,
    /// Where it came from, for logs and results.
    pub source: &'static str,
    /// The `#!` wrapper (a pyenv shim) found as the default interpreter, when `path` is what
    /// it selects ([`crate::interpreter_shim`]): the child's `PATH` then starts with `path`'s
    /// directory, as `pyenv exec` does.
    pub wrapper: Option<PathBuf>,
}

/// No interpreter could be found.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    /// The configured interpreter does not exist or cannot be run.
    #[error("code_execution.python is {path}, which is not an executable file; fix the setting or remove it to use python3 from PATH")]
    ConfiguredMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// The configured interpreter is named for a Python older than the stub supports.
    #[error("code_execution.python is {path}, which is Python {}.{}; scripts need Python {}.{} or newer: point the setting at a newer interpreter or remove it to use python3 from PATH", version.0, version.1, MIN_VERSION.0, MIN_VERSION.1)]
    ConfiguredTooOld {
        /// The configured path.
        path: PathBuf,
        /// The version its resolved file name declares.
        version: (u32, u32),
    },
    /// The configured interpreter is named like no Python, and asked, it did not say it is
    /// one (`/bin/true` ran every script as a success with no output).
    #[error("code_execution.python is {path}, which is not a Python interpreter: {why}; point the setting at Python {}.{} or newer, or remove it to use python3 from PATH", MIN_VERSION.0, MIN_VERSION.1)]
    ConfiguredNotPython {
        /// The configured path.
        path: PathBuf,
        /// What asking it gave.
        why: String,
    },
    /// The default interpreter is a `#!` wrapper (a pyenv shim) that selects, for the
    /// execution's cwd, a Python older than the stub supports.
    #[error("{found_as} is {wrapper}, a #! wrapper (a pyenv shim) that selects {selected} in {cwd}, which is Python {}.{}; scripts need Python {}.{} or newer: select a newer one for that directory (pyenv: `pyenv local 3.12` there, or PYENV_VERSION) or set code_execution.python to a newer interpreter", version.0, version.1, MIN_VERSION.0, MIN_VERSION.1)]
    WrapperTooOld {
        /// How the wrapper was found: `code_execution.python`, `python3 on PATH`, …
        found_as: &'static str,
        /// The wrapper.
        wrapper: PathBuf,
        /// The interpreter it selects.
        selected: PathBuf,
        /// That interpreter's version.
        version: (u32, u32),
        /// The cwd it selected it for (the execution's session dir).
        cwd: PathBuf,
    },
    /// Nothing on PATH.
    #[error("no Python interpreter found: python3 is not on PATH; install Python 3.8+ or set code_execution.python in config.yaml")]
    NotOnPath,
}

impl InterpreterError {
    /// Whether the `code_execution.python` setting is at fault (a configuration error), not
    /// the machine.
    pub fn is_setting(&self) -> bool {
        match self {
            InterpreterError::ConfiguredMissing { .. }
            | InterpreterError::ConfiguredTooOld { .. }
            | InterpreterError::ConfiguredNotPython { .. } => true,
            InterpreterError::WrapperTooOld { found_as, .. } => *found_as == CONFIGURED_SOURCE,
            InterpreterError::NotOnPath => false,
        }
    }
}

/// [`Interpreter::source`] of the embedding host's own interpreter ([`Resolution::host`]).
pub const HOST_SOURCE: &str = "host sys.executable";

/// [`Interpreter::source`] of `code_execution.python`.
pub const CONFIGURED_SOURCE: &str = "code_execution.python";

/// Inputs of the resolution, taken from the caller's environment.
#[derive(Debug, Clone, Default)]
pub struct Resolution {
    /// `code_execution.python`.
    pub configured: Option<PathBuf>,
    /// The embedding host's own interpreter (a Python host's `sys.executable`): the default
    /// when nothing is configured, before `python3` on PATH.
    pub host: Option<PathBuf>,
    /// `VIRTUAL_ENV` of the caller.
    pub virtual_env: Option<OsString>,
    /// `CONDA_PREFIX` of the caller.
    pub conda_prefix: Option<OsString>,
    /// `PATH` of the caller.
    pub path: Option<OsString>,
    /// The caller's environment as probes of the interpreter get it ([`crate::interpreter_probe`]).
    pub probe_env: ProbeEnv,
}

impl Resolution {
    /// Reads the inputs from this process's environment.
    pub fn from_env(configured: Option<PathBuf>) -> Self {
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Resolution {
            configured,
            host: None,
            virtual_env: nonempty("VIRTUAL_ENV").map(absolute),
            conda_prefix: nonempty("CONDA_PREFIX").map(absolute),
            path: nonempty("PATH"),
            probe_env: ProbeEnv::default(),
        }
    }

    /// The same inputs with the environment probes get made from `env` (the caller's
    /// environment and passthrough names, as the script child's is).
    pub fn with_probe_env(mut self, env: ProbeEnv) -> Self {
        self.probe_env = env;
        self
    }

    /// The same inputs with the embedding host's interpreter ([`Resolution::host`]).
    pub fn with_host(mut self, host: Option<PathBuf>) -> Self {
        self.host = host;
        self
    }

    /// The interpreter for `mode`, for an execution whose session dir is `cwd` (a wrapper
    /// selects by the dir it runs in).
    pub fn resolve(&self, mode: Mode, cwd: &Path) -> Result<Interpreter, InterpreterError> {
        if mode == Mode::Project {
            for (var, prefix) in [
                ("VIRTUAL_ENV", &self.virtual_env),
                ("CONDA_PREFIX", &self.conda_prefix),
            ] {
                let Some(prefix) = prefix else { continue };
                match env_interpreter(Path::new(prefix), &self.probe_env) {
                    Ok(path) => {
                        return Ok(Interpreter {
                            path,
                            source: if var == "VIRTUAL_ENV" {
                                "VIRTUAL_ENV"
                            } else {
                                "CONDA_PREFIX"
                            },
                            wrapper: None,
                        })
                    }
                    Err(why) => tracing::warn!(
                        "execute_code: not using the {var} interpreter ({}): {why}; falling back to {}",
                        Path::new(prefix).display(),
                        if var == "VIRTUAL_ENV" && self.conda_prefix.is_some() {
                            "the CONDA_PREFIX interpreter"
                        } else {
                            "the default interpreter"
                        }
                    ),
                }
            }
        }
        let interpreter = self.default_interpreter()?;
        if crate::interpreter_shim::is_script(&interpreter.path) {
            return self.through_wrapper(interpreter, mode, cwd);
        }
        Ok(interpreter)
    }

    /// What the wrapper `interpreter` selects for `cwd`, checked like any interpreter
    /// (docs/interpreter.md); the wrapper itself when it cannot say (strict mode then refuses
    /// it with its own explanation).
    fn through_wrapper(
        &self,
        interpreter: Interpreter,
        mode: Mode,
        cwd: &Path,
    ) -> Result<Interpreter, InterpreterError> {
        let wrapper = interpreter.path.clone();
        match crate::interpreter_shim::real_interpreter(&wrapper, cwd, &self.probe_env) {
            Ok(selected) if selected.version < MIN_VERSION => {
                Err(InterpreterError::WrapperTooOld {
                    found_as: match interpreter.source {
                        CONFIGURED_SOURCE => CONFIGURED_SOURCE,
                        HOST_SOURCE => "the host interpreter",
                        _ => "the interpreter found on PATH",
                    },
                    wrapper,
                    selected: selected.path,
                    version: selected.version,
                    cwd: cwd.to_path_buf(),
                })
            }
            Ok(selected) => {
                tracing::debug!(
                    "execute_code: running {} (Python {}.{}), what the wrapper {} selects in {}",
                    selected.path.display(),
                    selected.version.0,
                    selected.version.1,
                    wrapper.display(),
                    cwd.display()
                );
                Ok(Interpreter {
                    path: selected.path,
                    wrapper: Some(wrapper),
                    ..interpreter
                })
            }
            Err(why) => {
                tracing::warn!(
                    "execute_code: cannot resolve the wrapper interpreter {}: {why}; {}",
                    wrapper.display(),
                    match mode {
                        Mode::Project => "running the wrapper itself, unchecked",
                        Mode::Strict => "strict mode cannot run it",
                    }
                );
                Ok(interpreter)
            }
        }
    }

    /// The default interpreter: configured, else the embedding host's, else `python3` (then
    /// `python`) on PATH.
    pub fn default_interpreter(&self) -> Result<Interpreter, InterpreterError> {
        if let Some(p) = &self.configured {
            let found = if p.components().count() == 1 {
                self.which(p.as_os_str())
            } else {
                is_executable(p).then(|| p.clone())
            };
            let path =
                found.ok_or_else(|| InterpreterError::ConfiguredMissing { path: p.clone() })?;
            if let Some(version) = version_in_name(&path).filter(|v| *v < MIN_VERSION) {
                return Err(InterpreterError::ConfiguredTooOld {
                    path: p.clone(),
                    version,
                });
            }
            if !named_like_python(&path) && !crate::interpreter_shim::is_script(&path) {
                // Asked once a while ([`probe_version`]); a `#!` wrapper is asked what it runs
                // instead, and an interpreter named like one is believed, as starting it to
                // ask costs what the script does.
                match probe_version(&path, &self.probe_env) {
                    Ok(version) if version < MIN_VERSION => {
                        return Err(InterpreterError::ConfiguredTooOld {
                            path: p.clone(),
                            version,
                        })
                    }
                    Ok(_) => {}
                    Err(why) => {
                        return Err(InterpreterError::ConfiguredNotPython {
                            path: p.clone(),
                            why,
                        })
                    }
                }
            }
            return Ok(Interpreter {
                path,
                source: CONFIGURED_SOURCE,
                wrapper: None,
            });
        }
        if let Some(host) = &self.host {
            // Not a setting the user wrote, so an unusable one is no error: fall back to PATH
            // (and say why), as an unusable virtualenv does.
            match version_in_name(host).filter(|v| *v < MIN_VERSION) {
                _ if !is_executable(host) => tracing::warn!(
                    "execute_code: the host interpreter {} is not an executable file; using python3 from PATH",
                    host.display()
                ),
                Some(v) => tracing::warn!(
                    "execute_code: the host interpreter {} is Python {}.{}, older than {}.{}; using python3 from PATH",
                    host.display(),
                    v.0,
                    v.1,
                    MIN_VERSION.0,
                    MIN_VERSION.1
                ),
                None => {
                    return Ok(Interpreter {
                        path: host.clone(),
                        source: HOST_SOURCE,
                        wrapper: None,
                    })
                }
            }
        }
        for name in ["python3", "python"] {
            if let Some(path) = self.which(name.as_ref()) {
                return Ok(Interpreter {
                    path,
                    source: "PATH",
                    wrapper: None,
                });
            }
        }
        Err(InterpreterError::NotOnPath)
    }

    fn which(&self, name: &std::ffi::OsStr) -> Option<PathBuf> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        which::which_in(name, self.path.as_ref(), cwd).ok()
    }
}

/// The version the interpreter's file name declares once its links are followed
/// (`python3` → `python3.11`), if it declares one. Setting an old interpreter otherwise shows up
/// only as a `SyntaxError` in the stub, naming no setting; this costs a few `readlink`s where
/// asking the interpreter would cost as much as the script.
fn version_in_name(exe: &Path) -> Option<(u32, u32)> {
    let real = crate::real_path::canonical(exe).ok()?;
    parse_version(real.file_name()?.to_str()?.strip_prefix("python")?)
}

/// Whether the file `exe` resolves to is named like a Python interpreter (`python3.12`,
/// `python`, `pypy3`).
fn named_like_python(exe: &Path) -> bool {
    crate::real_path::canonical(exe)
        .ok()
        .and_then(|real| real.file_name()?.to_str().map(str::to_string))
        .is_some_and(|name| name.starts_with("python") || name.starts_with("pypy"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `value` (a path from the caller's environment) made absolute against this process's cwd:
/// a relative `VIRTUAL_ENV=venv` means the `venv` of the shell that set it, whichever session
/// cwd the script then runs in. Left as it is when the cwd is unknown.
fn absolute(value: OsString) -> OsString {
    let path = Path::new(&value);
    if path.is_absolute() {
        return value;
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(path).into_os_string(),
        Err(_) => value,
    }
}

/// The interpreter of a venv or conda prefix, if it exists and is recent enough.
fn env_interpreter(prefix: &Path, probe_env: &ProbeEnv) -> Result<PathBuf, String> {
    if !prefix.is_dir() {
        return Err(if prefix.exists() {
            "it is not a directory".into()
        } else {
            "the directory does not exist".into()
        });
    }
    let exe = ["bin/python3", "bin/python"]
        .iter()
        .map(|rel| prefix.join(rel))
        .find(|p| is_executable(p))
        .ok_or("it has no executable bin/python3 or bin/python")?;
    let version = match trusted_declared_version(prefix, &exe) {
        Some(v) => v,
        None => probe_version(&exe, probe_env)?,
    };
    if version < MIN_VERSION {
        return Err(format!(
            "it is Python {}.{}, older than the required {}.{}",
            version.0, version.1, MIN_VERSION.0, MIN_VERSION.1
        ));
    }
    Ok(exe)
}

/// The version a prefix declares, when `exe` is what the declaration describes (see the module
/// docs); `None` means the interpreter must be asked. No process is started: a few `readlink`s
/// and the read of `pyvenv.cfg`.
fn trusted_declared_version(prefix: &Path, exe: &Path) -> Option<(u32, u32)> {
    let cfg = std::fs::read_to_string(prefix.join("pyvenv.cfg")).ok();
    let cfg_value = |wanted: &[&str]| {
        cfg.as_deref()?.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            wanted
                .contains(&key.trim())
                .then(|| value.trim().to_string())
        })
    };
    let version = cfg_value(&["version", "version_info"])
        .and_then(|v| parse_version(&v))
        .or_else(|| lib_version(prefix))?;
    // The base interpreter's directory: a venv names it; a conda env or an old-style
    // virtualenv holds its interpreter in its own bin.
    let home = match cfg_value(&["home"]) {
        Some(home) => PathBuf::from(home),
        None => prefix.join("bin"),
    };
    let real = crate::real_path::canonical(exe).ok()?;
    let in_home = real.parent()? == crate::real_path::canonical(&home).ok()?.as_path();
    (in_home && name_fits(real.file_name()?.to_str()?, version)).then_some(version)
}

/// Whether an interpreter file called `name` can be the Python `version`: `python`,
/// `python3`, `python3.12` (and `python3.13t`) for 3.12; not `python3.6`, not `cat`.
fn name_fits(name: &str, version: (u32, u32)) -> bool {
    let Some(rest) = name.strip_prefix("python") else {
        return false;
    };
    rest.is_empty()
        || rest == version.0.to_string()
        || (rest.contains('.') && parse_version(rest) == Some(version))
}

/// The version of the single `lib/pythonX.Y` directory of a prefix.
fn lib_version(prefix: &Path) -> Option<(u32, u32)> {
    let mut found = None;
    for entry in std::fs::read_dir(prefix.join("lib")).ok()?.flatten() {
        let name = entry.file_name();
        let Some(v) = name
            .to_str()
            .and_then(|n| n.strip_prefix("python"))
            .and_then(parse_version)
        else {
            continue;
        };
        if found.is_some() {
            return None; // Several versions: only the interpreter itself can tell.
        }
        found = Some(v);
    }
    found
}

/// How long the interpreter may take to report its version.
const VERSION_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which file a path resolves to, as far as its version can change: device, inode, size and
/// modification time of the file the links lead to.
type FileStamp = (u64, u64, u64, i64, i64);

fn stamp(exe: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

type VersionAnswer = Result<(u32, u32), String>;

/// Answers by (executable, the file it resolves to), with when each was given.
type VersionCache = HashMap<(PathBuf, FileStamp), (Instant, VersionAnswer)>;

/// Answers of [`probe_version`] by executable and the file it resolves to, with when they were
/// given: a one-shot `run` resolves its interpreter at prestart and again at execute, and must
/// not start (or wait for) a probe twice.
static VERSIONS: LazyLock<Mutex<VersionCache>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Asks the interpreter itself (bounded: a broken one must not hang the execution), or reuses
/// an answer it gave less than [`PROBE_ANSWER_TTL`] ago: the file it resolves to is the same,
/// but a wrapper's answer can depend on more than that file, so none is kept for good.
fn probe_version(exe: &Path, env: &ProbeEnv) -> VersionAnswer {
    let key = stamp(exe).map(|s| (exe.to_path_buf(), s));
    let cache = || VERSIONS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((asked, answer)) = key.as_ref().and_then(|k| cache().get(k).cloned()) {
        if asked.elapsed() < PROBE_ANSWER_TTL {
            return answer;
        }
    }
    let answer = ask_version(exe, env);
    if let Some(key) = key {
        let mut cache = cache();
        cache.retain(|_, (asked, _)| asked.elapsed() < PROBE_ANSWER_TTL);
        cache.insert(key, (Instant::now(), answer.clone()));
    }
    answer
}

fn ask_version(exe: &Path, env: &ProbeEnv) -> VersionAnswer {
    use crate::interpreter_probe::{ask, Isolation, ProbeError};
    let code = "import sys; print('%d.%d' % sys.version_info[:2])";
    let answer = ask(
        exe,
        Isolation::Isolated,
        code,
        None,
        VERSION_PROBE_TIMEOUT,
        env,
    )
    .map_err(|e| match e {
        ProbeError::TimedOut(t) => {
            format!("it did not report its version within {} s", t.as_secs())
        }
        other => other.to_string(),
    })?;
    parse_version(answer.stdout.trim()).ok_or_else(|| {
        if answer.status.success() {
            "it did not report a Python version".into()
        } else {
            // Python 2 stops at the `-I` flag (new in 3.4) before running anything.
            format!(
                "it did not report a Python version (asked with `-I -c`, it ended with {}, \
                 as Python 2, which has no `-I`, and programs that are not Python do); \
                 Python 3.8 or newer is needed",
                answer.status
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(parse_version("3.11.7"), Some((3, 11)));
        assert_eq!(parse_version("3.8"), Some((3, 8)));
        assert_eq!(parse_version("3.13t"), Some((3, 13)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn only_an_interpreter_named_for_the_declared_version_is_believed() {
        for name in ["python", "python3", "python3.12", "python3.12t"] {
            assert!(name_fits(name, (3, 12)), "{name}");
        }
        for name in ["python3.6", "python2", "cat", "python3.1", "pythonw"] {
            assert!(!name_fits(name, (3, 12)), "{name}");
        }
    }

    #[test]
    fn a_missing_env_falls_back() {
        let r = Resolution {
            virtual_env: Some("/definitely/not/here".into()),
            path: std::env::var_os("PATH"),
            ..Resolution::default()
        };
        let i = r.resolve(Mode::Project, Path::new("/")).unwrap();
        assert_eq!(i.source, "PATH");
    }

    #[test]
    fn a_configured_interpreter_named_for_an_old_python_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("python2.7");
        std::fs::write(&real, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("python");
        std::os::unix::fs::symlink("python2.7", &link).unwrap();
        let r = Resolution {
            configured: Some(link.clone()),
            ..Resolution::default()
        };
        let err = r.resolve(Mode::Project, Path::new("/")).unwrap_err();
        assert!(
            matches!(
                err,
                InterpreterError::ConfiguredTooOld {
                    version: (2, 7),
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("is Python 2.7; scripts need Python 3.8"),
            "{err}"
        );
        // A name that declares no minor version is not judged by its name.
        let plain = dir.path().join("python3");
        std::fs::copy(&real, &plain).unwrap();
        let r = Resolution {
            configured: Some(plain.clone()),
            ..Resolution::default()
        };
        assert_eq!(
            r.resolve(Mode::Project, Path::new("/")).unwrap().path,
            plain
        );
    }

    #[test]
    fn a_configured_interpreter_must_exist() {
        let r = Resolution {
            configured: Some("/no/such/python".into()),
            ..Resolution::default()
        };
        assert!(matches!(
            r.resolve(Mode::Strict, Path::new("/")),
            Err(InterpreterError::ConfiguredMissing { .. })
        ));
    }

    #[test]
    fn the_host_interpreter_is_named_as_such_and_yields_to_the_setting() {
        let host = vibeos_testkit::python3();
        let r = Resolution {
            host: Some(host.clone()),
            path: std::env::var_os("PATH"),
            ..Resolution::default()
        };
        let i = r.resolve(Mode::Project, Path::new("/")).unwrap();
        assert_eq!((i.path.as_path(), i.source), (host.as_path(), HOST_SOURCE));
        let configured = Resolution {
            configured: Some(host.clone()),
            ..r.clone()
        };
        assert_eq!(
            configured
                .resolve(Mode::Project, Path::new("/"))
                .unwrap()
                .source,
            "code_execution.python"
        );
        // A host interpreter that is gone falls back to PATH instead of failing.
        let gone = Resolution {
            host: Some("/no/such/python".into()),
            ..r
        };
        assert_eq!(
            gone.resolve(Mode::Project, Path::new("/")).unwrap().source,
            "PATH"
        );
    }
}
