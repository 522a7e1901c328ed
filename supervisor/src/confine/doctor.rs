//! `vibeos-exec doctor`: what this machine supports and what each mode enforces here.
//!
//! Every probe is read-only (version queries, sysctls, mount table), so doctor is safe to run
//! anywhere; the verdict for strict mode comes from the same checks [`super::prepare`] makes.

use serde_json::{json, Value};

/// What the probes found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Landlock ABI, or why it is unavailable.
    pub landlock: Result<i32, String>,
    /// Seccomp filter support.
    pub seccomp: Result<(), String>,
    /// Unprivileged user namespaces (`user.max_user_namespaces`), or why not.
    pub user_namespaces: Result<u64, String>,
    /// Mount point of the cgroup v2 hierarchy, if any.
    pub cgroup2_mount: Option<String>,
    /// Controllers that hierarchy offers (empty when v1 holds them all).
    pub cgroup2_controllers: Vec<String>,
    /// Whether the supervisor runs as root.
    pub root: bool,
    /// Whether the policies load (their error otherwise).
    pub policies: Result<(), String>,
    /// Whether the configuration opens `terminal` to strict scripts
    /// (`code_execution.strict.terminal`), which runs it outside the sandbox. The probes do not
    /// read the configuration: the caller sets it.
    pub strict_terminal: bool,
    /// The remote backend scripts and tools run in (`None`: this machine). Set by the caller
    /// from the selected backend.
    pub remote_backend: Option<&'static str>,
}

impl Report {
    /// The report with what `config` opens on top of the machine's abilities.
    pub fn with_config(mut self, config: &crate::config::Config) -> Self {
        self.strict_terminal = super::StrictOptions::from_config(config).terminal;
        self
    }

    /// The report for scripts run by `backend` (`local`: this machine).
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        self.remote_backend = (backend != "local").then_some(backend);
        self
    }
}

/// Runs the probes.
pub fn probe() -> Report {
    let user_namespaces = match std::fs::read_to_string("/proc/sys/user/max_user_namespaces") {
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(0) => Err("disabled (user.max_user_namespaces = 0)".into()),
            Ok(n) => Ok(n),
            Err(_) => Err("user.max_user_namespaces is unreadable".into()),
        },
        Err(e) => Err(format!("cannot read user.max_user_namespaces: {e}")),
    };
    let cgroup2_mount = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                right
                    .starts_with("cgroup2 ")
                    .then(|| left.split_whitespace().nth(4).map(str::to_string))
                    .flatten()
            })
        });
    let cgroup2_controllers = cgroup2_mount
        .as_ref()
        .and_then(|m| std::fs::read_to_string(format!("{m}/cgroup.controllers")).ok())
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let policies = super::policy::load_seccomp(None)
        .map(|_| ())
        .and_then(|_| super::policy::load_landlock(None).map(|_| ()))
        .map_err(|e| e.to_string());
    Report {
        landlock: super::landlock_abi(),
        seccomp: super::seccomp_available(),
        user_namespaces,
        cgroup2_mount,
        cgroup2_controllers,
        root: rustix::process::geteuid().is_root(),
        policies,
        strict_terminal: false,
        remote_backend: None,
    }
}

impl Report {
    /// Why strict mode would refuse here, if it would.
    pub fn strict_blocker(&self) -> Option<String> {
        if let Some(backend) = self.remote_backend {
            return Some(crate::RemoteError::StrictRemote(backend).to_string());
        }
        match &self.landlock {
            Err(why) => return Some(format!("landlock is unavailable: {why}")),
            Ok(abi) if *abi < super::policy::TESTED_ABI => {
                return Some(format!(
                    "landlock ABI {abi} is older than the ABI {} strict mode needs (Linux 6.12+)",
                    super::policy::TESTED_ABI
                ))
            }
            _ => {}
        }
        if let Err(why) = &self.seccomp {
            return Some(format!("seccomp is unavailable: {why}"));
        }
        if let Err(why) = &self.policies {
            return Some(why.clone());
        }
        None
    }

    fn cgroup_usable(&self) -> bool {
        ["pids", "memory"]
            .iter()
            .all(|c| self.cgroup2_controllers.iter().any(|x| x == c))
    }

    /// What each mode enforces on this machine, one line each.
    pub fn enforcement(&self) -> (Vec<String>, Vec<String>) {
        if let Some(backend) = self.remote_backend {
            let project = vec![
                "environment scrubbing (SPEC §4; this host's PATH, HOME and XDG_* stay here), \
                 tool allowlist and call budget"
                    .to_string(),
                format!(
                    "timeout, output caps; the script's whole process group in the {backend} \
                     backend killed at the end"
                ),
                format!(
                    "the script, terminal and the file tools run inside the {backend} backend, \
                     with the rights of its user there (the backend is the isolation; what \
                     it shares with this machine is what its settings mount or forward)"
                ),
            ];
            let strict = vec![format!(
                "REFUSES to run: {}",
                self.strict_blocker().unwrap_or_default()
            )];
            return (project, strict);
        }
        let project = vec![
            "environment scrubbing (SPEC §4), tool allowlist and call budget".to_string(),
            "timeout, output caps; every descendant killed via the per-execution subreaper"
                .to_string(),
            "no filesystem, network or syscall confinement (the script runs as you, in the \
             project dir)"
                .to_string(),
            "tools act with the supervisor's rights: file tools on any path, terminal runs any \
             command"
                .to_string(),
        ];
        let strict = match self.strict_blocker() {
            Some(why) => vec![format!("REFUSES to run: {why}")],
            None => {
                let mut v = vec![
                    "everything project mode enforces, in the staging dir on the default \
                     interpreter"
                        .to_string(),
                    "landlock: read+execute the interpreter and system libraries, read+write the \
                     staging dir, nothing else; no TCP bind/connect; abstract unix sockets and \
                     signals scoped to the script"
                        .to_string(),
                    "seccomp allowlist (EPERM otherwise): no new sockets, ptrace, namespaces, \
                     io_uring, bpf, keyctl, mount, userfaultfd, personality, TIOCSTI, \
                     inotify/fanotify, chmod/chown/utime/xattr changes, path-based xattr reads; \
                     setpriority/sched_set*/prlimit only on the script itself"
                        .to_string(),
                    "tools: read_file/search_files read beneath the staging dir, the session cwd \
                     and code_execution.strict.read_roots; write_file/patch write beneath the \
                     staging dir, the session cwd and code_execution.strict.write_roots (openat2 \
                     RESOLVE_BENEATH: no symlink, `..`, hard link or /proc way out); web_extract \
                     public hosts only; terminal not offered unless \
                     code_execution.strict.terminal is true"
                        .to_string(),
                ];
                if self.strict_terminal {
                    v.push(
                        "WARNING: code_execution.strict.terminal is true: strict scripts may run \
                         shell commands through terminal, and those run OUTSIDE the sandbox, as \
                         the supervisor's user (scrubbed environment only)"
                            .to_string(),
                    );
                }
                v.extend([
                    "tools only over a pre-connected socketpair (no socket path to dial)"
                        .to_string(),
                    "no_new_privs: setuid binaries and file capabilities grant nothing".to_string(),
                ]);
                v.push(if self.root {
                    "runs as its own unprivileged uid (leased: never shared with a live \
                     execution), no groups, no capability (a closed interpreter dir is revealed \
                     in a private mount namespace); pids and memory bounded by RLIMIT_NPROC (per \
                     uid) and RLIMIT_DATA/RLIMIT_AS; disk by a tmpfs of \
                     code_execution.strict.disk_mb on the staging dir"
                        .to_string()
                } else {
                    "runs as your uid (not root, so no uid to drop to and nothing to mount): \
                     executions share it; pids bounded by RLIMIT_NPROC counted over all your \
                     processes, memory by RLIMIT_DATA/AS, disk only per file (RLIMIT_FSIZE)"
                        .to_string()
                });
                v.push(if self.cgroup_usable() {
                    "cgroup v2 pids/memory controllers exist but are not used: rlimits are \
                     enforced instead (see docs/strict-mode.md)"
                        .to_string()
                } else {
                    "no cgroup v2 pids/memory controllers here: limits are rlimits".to_string()
                });
                v
            }
        };
        (project, strict)
    }

    /// Plain-text report.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let ok = |b: bool| if b { "yes" } else { "no " };
        s.push_str("vibeos-exec doctor\n\nthis machine:\n");
        s.push_str(&format!(
            "  landlock          {}\n",
            match &self.landlock {
                Ok(abi) => format!("ABI {abi}"),
                Err(why) => format!("unavailable ({why})"),
            }
        ));
        s.push_str(&format!(
            "  seccomp           {}\n",
            match &self.seccomp {
                Ok(()) => "filters with errno actions".to_string(),
                Err(why) => format!("unavailable ({why})"),
            }
        ));
        s.push_str(&format!(
            "  user namespaces   {}\n",
            match &self.user_namespaces {
                Ok(n) => format!("available (max {n})"),
                Err(why) => why.clone(),
            }
        ));
        s.push_str(&format!(
            "  cgroup v2         {}\n",
            match &self.cgroup2_mount {
                None => "not mounted".to_string(),
                Some(m) if self.cgroup2_controllers.is_empty() =>
                    format!("{m}, no controllers delegated (pids/memory are on cgroup v1)"),
                Some(m) => format!("{m}, controllers: {}", self.cgroup2_controllers.join(" ")),
            }
        ));
        s.push_str(&format!("  running as root   {}\n", ok(self.root).trim()));
        s.push_str(&format!(
            "  policies          {}\n",
            match &self.policies {
                Ok(()) => "built-in seccomp and landlock policies load".to_string(),
                Err(e) => e.clone(),
            }
        ));
        let (project, strict) = self.enforcement();
        s.push_str("\nmode project enforces:\n");
        for l in project {
            s.push_str(&format!("  - {l}\n"));
        }
        s.push_str("\nmode strict enforces:\n");
        for l in strict {
            s.push_str(&format!("  - {l}\n"));
        }
        s
    }

    /// JSON report.
    pub fn to_json(&self) -> Value {
        let (project, strict) = self.enforcement();
        json!({
            "landlock_abi": self.landlock.as_ref().ok(),
            "landlock_error": self.landlock.as_ref().err(),
            "seccomp": self.seccomp.is_ok(),
            "seccomp_error": self.seccomp.as_ref().err(),
            "user_namespaces": self.user_namespaces.is_ok(),
            "cgroup2_mount": self.cgroup2_mount,
            "cgroup2_controllers": self.cgroup2_controllers,
            "root": self.root,
            "strict_available": self.strict_blocker().is_none(),
            "strict_blocker": self.strict_blocker(),
            "modes": { "project": project, "strict": strict },
        })
    }
}
