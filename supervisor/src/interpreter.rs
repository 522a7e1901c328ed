//! Which Python runs the script (SPEC §3).
//!
//! Project mode prefers the user's active environment (`VIRTUAL_ENV`, then `CONDA_PREFIX`) so
//! `import pandas` works as it does in their shell; anything unusable there (unset, broken,
//! older than 3.8) falls back to the default interpreter, with the reason logged. The version is
//! read from `pyvenv.cfg` or the `lib/pythonX.Y` layout when possible, because starting the
//! interpreter just to ask costs as much as the script itself.

use crate::config::Mode;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Oldest Python the stub supports.
pub const MIN_VERSION: (u32, u32) = (3, 8);

/// The interpreter chosen for one execution and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Executable to run.
    pub path: PathBuf,
    /// Where it came from, for logs and results.
    pub source: &'static str,
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
    /// Nothing on PATH.
    #[error("no Python interpreter found: python3 is not on PATH; install Python 3.8+ or set code_execution.python in config.yaml")]
    NotOnPath,
}

/// [`Interpreter::source`] of the embedding host's own interpreter ([`Resolution::host`]).
pub const HOST_SOURCE: &str = "host sys.executable";

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
}

impl Resolution {
    /// Reads the inputs from this process's environment.
    pub fn from_env(configured: Option<PathBuf>) -> Self {
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Resolution {
            configured,
            host: None,
            virtual_env: nonempty("VIRTUAL_ENV"),
            conda_prefix: nonempty("CONDA_PREFIX"),
            path: nonempty("PATH"),
        }
    }

    /// The same inputs with the embedding host's interpreter ([`Resolution::host`]).
    pub fn with_host(mut self, host: Option<PathBuf>) -> Self {
        self.host = host;
        self
    }

    /// The interpreter for `mode`.
    pub fn resolve(&self, mode: Mode) -> Result<Interpreter, InterpreterError> {
        if mode == Mode::Project {
            for (var, prefix) in [
                ("VIRTUAL_ENV", &self.virtual_env),
                ("CONDA_PREFIX", &self.conda_prefix),
            ] {
                let Some(prefix) = prefix else { continue };
                match env_interpreter(Path::new(prefix)) {
                    Ok(path) => {
                        return Ok(Interpreter {
                            path,
                            source: if var == "VIRTUAL_ENV" {
                                "VIRTUAL_ENV"
                            } else {
                                "CONDA_PREFIX"
                            },
                        })
                    }
                    Err(why) => tracing::warn!(
                        "execute_code: not using the {var} interpreter ({}): {why}; falling back to the default interpreter",
                        Path::new(prefix).display()
                    ),
                }
            }
        }
        let interpreter = self.default_interpreter()?;
        if mode == Mode::Strict && crate::interpreter_shim::is_script(&interpreter.path) {
            // A wrapper (pyenv shim) cannot run confined: run what it would run.
            match crate::interpreter_shim::real_interpreter(&interpreter.path) {
                Ok(path) => {
                    tracing::info!(
                        "execute_code: strict mode runs {} (what the wrapper {} runs)",
                        path.display(),
                        interpreter.path.display()
                    );
                    return Ok(Interpreter {
                        path,
                        ..interpreter
                    });
                }
                Err(why) => tracing::warn!(
                    "execute_code: cannot resolve the wrapper interpreter {}: {why}",
                    interpreter.path.display()
                ),
            }
        }
        Ok(interpreter)
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
            return Ok(Interpreter {
                path,
                source: "code_execution.python",
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
                    })
                }
            }
        }
        for name in ["python3", "python"] {
            if let Some(path) = self.which(name.as_ref()) {
                return Ok(Interpreter {
                    path,
                    source: "PATH",
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
    let real = std::fs::canonicalize(exe).ok()?;
    parse_version(real.file_name()?.to_str()?.strip_prefix("python")?)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The interpreter of a venv or conda prefix, if it exists and is recent enough.
fn env_interpreter(prefix: &Path) -> Result<PathBuf, String> {
    if !prefix.is_dir() {
        return Err("the directory does not exist".into());
    }
    let exe = ["bin/python3", "bin/python"]
        .iter()
        .map(|rel| prefix.join(rel))
        .find(|p| is_executable(p))
        .ok_or("it has no executable bin/python3 or bin/python")?;
    let version = match declared_version(prefix) {
        Some(v) => v,
        None => probe_version(&exe)?,
    };
    if version < MIN_VERSION {
        return Err(format!(
            "it is Python {}.{}, older than the required {}.{}",
            version.0, version.1, MIN_VERSION.0, MIN_VERSION.1
        ));
    }
    Ok(exe)
}

/// The version a prefix declares without running anything: `pyvenv.cfg`, else the single
/// `lib/pythonX.Y` directory.
fn declared_version(prefix: &Path) -> Option<(u32, u32)> {
    if let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg")) {
        for line in cfg.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if matches!(key.trim(), "version" | "version_info") {
                if let Some(v) = parse_version(value.trim()) {
                    return Some(v);
                }
            }
        }
    }
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

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut parts = s.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor_part = parts.next()?;
    let digits: String = minor_part
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, digits.parse().ok()?))
}

/// Asks the interpreter itself (bounded: a broken one must not hang the execution).
fn probe_version(exe: &Path) -> Result<(u32, u32), String> {
    let mut child = std::process::Command::new(exe)
        .args([
            "-I",
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("it cannot be started: {e}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("it did not report its version within 10 s".into());
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    parse_version(out.trim()).ok_or_else(|| "it did not report a Python version".into())
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
    fn a_missing_env_falls_back() {
        let r = Resolution {
            virtual_env: Some("/definitely/not/here".into()),
            path: std::env::var_os("PATH"),
            ..Resolution::default()
        };
        let i = r.resolve(Mode::Project).unwrap();
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
        let err = r.resolve(Mode::Project).unwrap_err();
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
        assert_eq!(r.resolve(Mode::Project).unwrap().path, plain);
    }

    #[test]
    fn a_configured_interpreter_must_exist() {
        let r = Resolution {
            configured: Some("/no/such/python".into()),
            ..Resolution::default()
        };
        assert!(matches!(
            r.resolve(Mode::Strict),
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
        let i = r.resolve(Mode::Project).unwrap();
        assert_eq!((i.path.as_path(), i.source), (host.as_path(), HOST_SOURCE));
        let configured = Resolution {
            configured: Some(host.clone()),
            ..r.clone()
        };
        assert_eq!(
            configured.resolve(Mode::Project).unwrap().source,
            "code_execution.python"
        );
        // A host interpreter that is gone falls back to PATH instead of failing.
        let gone = Resolution {
            host: Some("/no/such/python".into()),
            ..r
        };
        assert_eq!(gone.resolve(Mode::Project).unwrap().source, "PATH");
    }
}
