//! The strict-mode policies as data: a seccompiler JSON filter set and the landlock rules.
//!
//! Both are reviewed files under `policies/`, compiled into the binary as defaults so a
//! supervisor embedded elsewhere needs nothing on disk, and overridable by path
//! (`code_execution.strict.seccomp_policy` / `landlock_policy`) for an operator who needs to
//! loosen or tighten them. Loading validates everything up front, so a broken policy is a start
//! error naming the file and the problem — never a half-applied confinement.

use super::syscall_search;
use seccompiler::{BpfProgram, TargetArch};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The default seccomp filters (x86_64 syscall names).
pub const DEFAULT_SECCOMP_X86_64: &str = include_str!("../../../policies/seccomp-x86_64.json");
/// The default landlock rules.
pub const DEFAULT_LANDLOCK: &str = include_str!("../../../policies/landlock.json");

/// Names of the seccomp filters in a policy file, in the order they are installed. `main` is
/// the allowlist with its deny-by-default action; `overrides` (optional, default allow) changes
/// the error of the calls it matches (clone3 → ENOSYS so libc falls back to clone). The kernel
/// runs every installed filter and takes the most severe action, so the order does not change
/// what is allowed; `overrides` goes first so that `main`, installed last, need not allow
/// seccomp(2) itself.
pub const FILTER_ORDER: [&str; 2] = ["overrides", "main"];

/// A policy file is unusable.
#[derive(Debug, thiserror::Error)]
#[error("strict-mode policy {source_name} is invalid: {problem}; fix the file or remove the setting to use the built-in policy")]
pub struct PolicyError {
    /// `built-in seccomp policy`, or the path of the override.
    pub source_name: String,
    /// What is wrong.
    pub problem: String,
}

fn policy_text(
    path: Option<&Path>,
    default: &'static str,
    what: &str,
) -> Result<(String, String), PolicyError> {
    match path {
        None => Ok((default.to_string(), format!("built-in {what} policy"))),
        Some(p) => std::fs::read_to_string(p)
            .map(|t| (t, p.display().to_string()))
            .map_err(|e| PolicyError {
                source_name: p.display().to_string(),
                problem: format!("cannot read it: {e}"),
            }),
    }
}

/// Compiles the seccomp policy (default or `path`) to BPF programs in installation order: one
/// program when its two filters can be merged ([`syscall_search::merged_program`]), else one
/// per filter.
pub fn load_seccomp(path: Option<&Path>) -> Result<Vec<BpfProgram>, PolicyError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        other => {
            return Err(PolicyError {
                source_name: "built-in seccomp policy".into(),
                problem: format!(
                    "it is written for x86_64 syscall names and this machine is {other}; \
                     strict mode refuses to run without a filter for this architecture \
                     (set code_execution.strict.seccomp_policy to one)"
                ),
            })
        }
    };
    let (text, source_name) = policy_text(path, DEFAULT_SECCOMP_X86_64, "seccomp")?;
    if let Some((_, programs)) = lock_compiled().iter().find(|(t, _)| *t == text) {
        return Ok(programs.clone());
    }
    let err = |problem: String| PolicyError {
        source_name: source_name.clone(),
        problem,
    };
    // Check the names first: seccompiler would silently accept a filter set without `main`.
    let names: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| err(format!("not a JSON object: {e}")))?;
    if !names.contains_key("main") {
        return Err(err("it has no `main` filter (the syscall allowlist)".into()));
    }
    if let Some(unknown) = names.keys().find(|k| !FILTER_ORDER.contains(&k.as_str())) {
        return Err(err(format!(
            "unknown filter `{unknown}`; the filters are `main` and `overrides`"
        )));
    }
    let mut map = seccompiler::compile_from_json(text.as_bytes(), arch)
        .map_err(|e| err(format!("seccompiler rejected it: {e}")))?;
    // Both filters as one program where that decides every call the same (the built-in
    // policy's `overrides` has no argument conditions): one install instead of two.
    let merged = match FILTER_ORDER.map(|name| names.get(name)) {
        [Some(first), Some(last)] => syscall_search::merged_program(first, last, arch)
            .map_err(|e| tracing::debug!("seccomp filters of {source_name} stay two programs: {e}"))
            .ok(),
        _ => None,
    };
    // seccompiler's programs prove the policy compiles; the installed ones find the syscall by
    // binary search (see `syscall_search`), unless a filter cannot be rebuilt.
    let programs: Vec<BpfProgram> = match merged {
        Some(merged) => vec![merged],
        None => FILTER_ORDER
            .iter()
            .filter_map(|name| {
                let linear = map.remove(*name)?;
                let filter = names.get(*name)?;
                Some(match syscall_search::searched_program(filter, arch) {
                    Ok(searched) => searched,
                    Err(e) => {
                        tracing::warn!(
                            "seccomp filter `{name}` of {source_name} is installed as one chain: {e}"
                        );
                        linear
                    }
                })
            })
            .collect(),
    };
    if programs.iter().any(|p| p.is_empty() || p.len() > 4096) {
        return Err(err(
            "a filter compiles to an empty program or more than 4096 BPF instructions".into(),
        ));
    }
    let mut compiled = lock_compiled();
    if compiled.len() >= COMPILED_KEPT {
        compiled.remove(0);
    }
    compiled.push((text, programs.clone()));
    Ok(programs)
}

/// Policy texts compiled so far, with their programs. Compiling the built-in policy (about a
/// thousand instructions) took a millisecond or more of every strict execution's start; the
/// text is still read every time, so an edited policy file is compiled (and checked) afresh.
static COMPILED: std::sync::Mutex<Vec<(String, Vec<BpfProgram>)>> =
    std::sync::Mutex::new(Vec::new());

/// Distinct policy texts kept compiled (the built-in one and a few configured files).
const COMPILED_KEPT: usize = 4;

fn lock_compiled() -> std::sync::MutexGuard<'static, Vec<(String, Vec<BpfProgram>)>> {
    COMPILED.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the staging dir may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StagingAccess {
    /// Read, write, create and remove below it (the default).
    ReadWrite,
    /// Read only.
    ReadOnly,
}

/// A landlock scope the script is confined to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeName {
    /// Abstract unix sockets created outside the script's domain cannot be reached.
    AbstractUnixSocket,
    /// Processes outside the script's domain cannot be signalled.
    Signal,
}

/// The landlock rules of strict mode.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockPolicy {
    /// Free text for reviewers; ignored.
    #[serde(default)]
    #[allow(dead_code)] // Accepted so the policy file can explain itself; nothing reads it.
    pub comment: Option<String>,
    /// Oldest landlock ABI that enforces the policy; older kernels make strict mode refuse.
    pub min_abi: i32,
    /// Paths (files or directories) readable and executable.
    #[serde(default)]
    pub read_execute: Vec<PathBuf>,
    /// Paths readable and writable (devices such as /dev/null).
    #[serde(default)]
    pub read_write: Vec<PathBuf>,
    /// Whether the interpreter's own files (executable, prefix) are added at run time.
    #[serde(default = "yes")]
    pub interpreter: bool,
    /// Access to the staging dir.
    pub staging: StagingAccess,
    /// TCP ports the script may bind.
    #[serde(default)]
    pub tcp_bind: Vec<u16>,
    /// TCP ports the script may connect to.
    #[serde(default)]
    pub tcp_connect: Vec<u16>,
    /// Scopes; strict mode requires both.
    #[serde(default)]
    pub scopes: Vec<ScopeName>,
}

fn yes() -> bool {
    true
}

/// The landlock ABI this policy format is written and tested against.
pub const TESTED_ABI: i32 = 6;

/// Loads and validates the landlock policy (default or `path`).
pub fn load_landlock(path: Option<&Path>) -> Result<LandlockPolicy, PolicyError> {
    let (text, source_name) = policy_text(path, DEFAULT_LANDLOCK, "landlock")?;
    let err = |problem: String| PolicyError {
        source_name: source_name.clone(),
        problem,
    };
    let policy: LandlockPolicy =
        serde_json::from_str(&text).map_err(|e| err(format!("not a valid policy: {e}")))?;
    if policy.min_abi < TESTED_ABI {
        return Err(err(format!(
            "min_abi is {}, but strict mode needs at least ABI {TESTED_ABI} (scoped abstract \
             unix sockets and signals)",
            policy.min_abi
        )));
    }
    for p in policy.read_execute.iter().chain(&policy.read_write) {
        if !p.is_absolute() {
            return Err(err(format!("path {} is not absolute", p.display())));
        }
        if p == Path::new("/") {
            return Err(err(
                "granting `/` would make the filesystem confinement meaningless".into(),
            ));
        }
    }
    for needed in [ScopeName::AbstractUnixSocket, ScopeName::Signal] {
        if !policy.scopes.contains(&needed) {
            return Err(err(format!(
                "scopes must include {needed:?}: without it the script could reach processes \
                 or abstract sockets outside its sandbox"
            )));
        }
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_policies_load() {
        let programs = load_seccomp(None).unwrap();
        assert_eq!(programs.len(), 1, "the built-in filters are one program");
        let ll = load_landlock(None).unwrap();
        assert!(ll.interpreter);
        assert_eq!(ll.staging, StagingAccess::ReadWrite);
        assert!(ll.tcp_connect.is_empty() && ll.tcp_bind.is_empty());
    }

    #[test]
    fn broken_policies_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        std::fs::write(&p, r#"{"other": {}}"#).unwrap();
        let e = load_seccomp(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("no `main` filter"), "{e}");
        std::fs::write(
            &p,
            r#"{"main": {"mismatch_action": {"errno": 1}, "match_action": "allow",
                "filter": [{"syscall": "no_such_call"}]}}"#,
        )
        .unwrap();
        let e = load_seccomp(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("seccompiler rejected"), "{e}");

        std::fs::write(
            &p,
            r#"{"min_abi": 6, "staging": "read_write", "scopes": ["signal"]}"#,
        )
        .unwrap();
        let e = load_landlock(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("AbstractUnixSocket"), "{e}");
        std::fs::write(
            &p,
            r#"{"min_abi": 6, "staging": "read_write", "read_execute": ["/"],
                "scopes": ["signal", "abstract_unix_socket"]}"#,
        )
        .unwrap();
        assert!(load_landlock(Some(&p)).is_err());
        std::fs::write(&p, r#"{"min_abi": 6, "staging": "rw", "bogus": 1}"#).unwrap();
        assert!(load_landlock(Some(&p)).is_err());
    }
}
