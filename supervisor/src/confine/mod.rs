//! Strict-mode confinement (SPEC §6): the script's only way out is its RPC channel.
//!
//! Everything that can fail is prepared here, in the supervisor, before the fork: the seccomp
//! filters are compiled to BPF, the landlock ruleset is created and its rules added, the uid,
//! gid and limits are chosen and the staging dir is handed to that uid. The child then only
//! applies the prepared values with raw system calls ([`child`]), in an order the script cannot
//! undo. When the kernel lacks a feature the policy needs, [`prepare`] fails with an error naming
//! it: strict mode never runs unconfined.
//!
//! Design choices and the alternatives rejected are in docs/strict-mode.md.

pub mod child;
pub mod doctor;
mod interpreter_paths;
pub mod policy;
pub mod reveal;
pub mod staging;
pub mod syscall_search;
pub mod tools;
pub mod uids;

use crate::config::Config;
use child::{ChildConfinement, Credentials, Rlimit};
pub use interpreter_paths::interpreter_paths;
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};
use policy::{LandlockPolicy, PolicyError, StagingAccess};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use vibeos_tools::config_file::StrictSection;

/// First uid of the range strict-mode scripts run as when the supervisor is root. It lies above
/// the ranges distributions and container managers hand out (below 2^31, above 0x6fffffff), so
/// no real account owns files the script could reach by DAC.
pub const UID_BASE: u32 = 0x7e00_0000;
/// Size of that range; each execution picks one uid in it at random.
pub const UID_SPAN: u32 = 0x1_0000;
/// Default `code_execution.strict.max_processes` (tasks, threads included).
pub const DEFAULT_MAX_PROCESSES: u64 = 256;
/// Default `code_execution.strict.memory_mb` (per-process data segment).
pub const DEFAULT_MEMORY_MB: u64 = 1024;
/// Default `code_execution.strict.file_size_mb` (largest file the script may write).
pub const DEFAULT_FILE_SIZE_MB: u64 = 1024;
/// Default `code_execution.strict.disk_mb` (disk space of one execution's staging dir and
/// TMPDIR).
pub const DEFAULT_DISK_MB: u64 = 512;

/// `RLIMIT_NOFILE` of a strict script: 3 descriptors per MiB of `memory_mb`, at least 64 and
/// at most 1024 (the common soft default; the default `memory_mb` of 1024 reaches it).
///
/// Every descriptor can hold kernel memory no memory rlimit counts: a socket of the script's
/// socketpairs its send buffer (the default `net.core.wmem_default`, 208 KiB, plus the one
/// message that may pass it — at most 1.5× that, 312 KiB; measured 208–233 KiB), a pipe its
/// 16 pages. Raising a buffer (`SO_SNDBUF`, `SO_RCVBUF`, their `FORCE` forms) and growing a
/// pipe (`F_SETPIPE_SZ`) are refused by the seccomp policy, so what one process holds through
/// its descriptors is at most `nofile × 312 KiB` ≤ 0.92 × `memory_mb`, and as much again in
/// descriptors in flight over `SCM_RIGHTS` (the kernel bounds those per uid by the sender's
/// `RLIMIT_NOFILE`). docs/strict-mode.md has the whole-execution bound.
pub const fn open_files(memory_bytes: u64) -> u64 {
    let per_mib = (memory_bytes >> 20).saturating_mul(3);
    if per_mib < 64 {
        64
    } else if per_mib > 1024 {
        1024
    } else {
        per_mib
    }
}

/// Pid of the process whose warm pool is on (0: none). A pinned uid is refused while one is,
/// since the pool would run several executions under that uid at once. The pool reports every
/// switch ([`note_pool_owner`]) rather than confinement asking it, so that confinement stays
/// below the launchers (pool, fork server) that use it.
static POOL_OWNER: AtomicU32 = AtomicU32::new(0);

/// Records which process's warm pool is on (`None`: no pool). Called by the pool whenever its
/// process-wide slot changes, under the slot's lock.
pub(crate) fn note_pool_owner(pid: Option<u32>) {
    POOL_OWNER.store(pid.unwrap_or(0), Ordering::SeqCst);
}

/// Whether this process keeps a warm pool (one enabled in a parent before a fork does not
/// count, as for the pool itself).
fn pool_active() -> bool {
    POOL_OWNER.load(Ordering::SeqCst) == std::process::id()
}

/// Settings of strict mode, from `code_execution.strict` in config.yaml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrictOptions {
    /// Pinned uid for the script when root (`uid`); `None` picks one per execution.
    pub uid: Option<u32>,
    /// Process (task) limit of the script's uid.
    pub max_processes: u64,
    /// Data-segment limit per process, in bytes.
    pub memory_bytes: u64,
    /// Largest file the script may write, in bytes.
    pub file_size_bytes: u64,
    /// Override of the seccomp policy.
    pub seccomp_policy: Option<PathBuf>,
    /// Override of the landlock policy.
    pub landlock_policy: Option<PathBuf>,
    /// Extra directories the file tools may read for a strict script (`read_roots`).
    pub read_roots: Vec<PathBuf>,
    /// Extra directories the file tools may read and write for a strict script (`write_roots`).
    pub write_roots: Vec<PathBuf>,
    /// Whether `terminal` is offered to strict scripts (`terminal`, default false). It then
    /// runs as the supervisor's user, outside the sandbox: an explicit opening by the operator.
    pub terminal: bool,
    /// Whether strict scripts get the plugin tools their plugins open to scripts
    /// (`plugin_tools`, default false). A plugin opens its own tool; only the operator can
    /// decide that a strict script may run that code with the plugin host's rights.
    pub plugin_tools: bool,
    /// Disk budget of one execution (staging dir and TMPDIR), in bytes (`disk_mb`).
    pub disk_bytes: u64,
    /// A configuration problem found when reading config.yaml; strict mode refuses with it.
    pub invalid: Option<String>,
}

impl Default for StrictOptions {
    fn default() -> Self {
        StrictOptions {
            uid: None,
            max_processes: DEFAULT_MAX_PROCESSES,
            memory_bytes: DEFAULT_MEMORY_MB << 20,
            file_size_bytes: DEFAULT_FILE_SIZE_MB << 20,
            seccomp_policy: None,
            landlock_policy: None,
            read_roots: Vec::new(),
            write_roots: Vec::new(),
            terminal: false,
            plugin_tools: false,
            disk_bytes: DEFAULT_DISK_MB << 20,
            invalid: None,
        }
    }
}

impl StrictOptions {
    /// Reads `code_execution.strict` from `config`. A bad value does not fail here (project
    /// mode must keep working); it is kept in [`StrictOptions::invalid`] and refuses strict mode.
    pub fn from_config(config: &Config) -> Self {
        let mut opts = StrictOptions::default();
        let strict = config
            .file
            .code_execution
            .as_ref()
            .and_then(|c| c.strict.as_ref());
        if let Err(problem) = strict.map_or(Ok(()), |s| opts.read(s)) {
            let file = config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "config.yaml".into());
            opts.invalid = Some(format!("config file {file}: {problem}"));
        }
        opts
    }

    /// Checks the values of `code_execution.strict` (types and key names were checked when
    /// the file was parsed).
    fn read(&mut self, strict: &StrictSection) -> Result<(), String> {
        let number = |key: &str, v: Option<u64>, max: u64| -> Result<Option<u64>, String> {
            match v {
                None => Ok(None),
                Some(n) if n > 0 && n <= max => Ok(Some(n)),
                Some(_) => Err(format!(
                    "`code_execution.strict.{key}` must be a whole number from 1 to {max}"
                )),
            }
        };
        let path = |key: &str, v: &Option<String>| -> Result<Option<PathBuf>, String> {
            match v {
                None => Ok(None),
                Some(s) if !s.is_empty() => Ok(Some(PathBuf::from(s))),
                Some(_) => Err(format!(
                    "`code_execution.strict.{key}` must be the path of a policy file"
                )),
            }
        };
        if let Some(uid) = number("uid", strict.uid, u32::MAX as u64 - 1)? {
            self.uid = Some(uid as u32);
        }
        if let Some(n) = number("max_processes", strict.max_processes, 1 << 22)? {
            self.max_processes = n;
        }
        if let Some(n) = number("memory_mb", strict.memory_mb, 1 << 30)? {
            self.memory_bytes = n << 20;
        }
        if let Some(n) = number("file_size_mb", strict.file_size_mb, 1 << 30)? {
            self.file_size_bytes = n << 20;
        }
        if let Some(n) = number("disk_mb", strict.disk_mb, 1 << 30)? {
            self.disk_bytes = n << 20;
        }
        let roots = |key: &str, v: &Option<Vec<String>>| -> Result<Vec<PathBuf>, String> {
            v.iter()
                .flatten()
                .map(|s| {
                    if s.starts_with('/') && Path::new(s) != Path::new("/") {
                        Ok(PathBuf::from(s))
                    } else {
                        Err(format!(
                            "`code_execution.strict.{key}` must be a list of absolute directory \
                             paths (not `/`)"
                        ))
                    }
                })
                .collect()
        };
        self.read_roots = roots("read_roots", &strict.read_roots)?;
        self.write_roots = roots("write_roots", &strict.write_roots)?;
        if let Some(b) = strict.terminal {
            self.terminal = b;
        }
        if let Some(b) = strict.plugin_tools {
            self.plugin_tools = b;
        }
        self.seccomp_policy = path("seccomp_policy", &strict.seccomp_policy)?;
        self.landlock_policy = path("landlock_policy", &strict.landlock_policy)?;
        Ok(())
    }
}

/// Why strict confinement cannot be set up. Strict mode then refuses to run.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The kernel lacks a feature the policy needs.
    #[error("strict mode refuses to run unconfined: {0}")]
    Unsupported(String),
    /// A policy file is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The configuration is invalid.
    #[error("strict mode is misconfigured: {0}")]
    Config(String),
    /// A step of the preparation failed.
    #[error("cannot prepare strict confinement: {what}: {source}")]
    Io {
        /// The step.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The script's uid could not reach a path it needs.
    #[error("strict mode cannot run: {0}")]
    Unreachable(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ConfineError {
    let what = what.into();
    move |source| ConfineError::Io { what, source }
}

/// The landlock ABI of the running kernel: `Ok(n)`, or why it is unavailable.
pub fn landlock_abi() -> Result<i32, String> {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only queries the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v >= 1 {
        return Ok(v as i32);
    }
    let e = std::io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel is built without landlock".into(),
        Some(libc::EOPNOTSUPP) => {
            "landlock is built in but disabled (add landlock to the lsm= boot parameter)".into()
        }
        _ => format!("the landlock version query failed: {e}"),
    })
}

/// Whether seccomp filters are supported.
pub fn seccomp_available() -> Result<(), String> {
    // SAFETY: PR_GET_SECCOMP has no side effects.
    let rc = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if rc < 0 {
        return Err("the kernel is built without seccomp (CONFIG_SECCOMP)".into());
    }
    // SECCOMP_GET_ACTION_AVAIL for SECCOMP_RET_ERRNO tells whether filters can return errors.
    let action: u32 = 0x0005_0000;
    // SAFETY: the kernel reads one u32 from `action`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            2u32, // SECCOMP_GET_ACTION_AVAIL
            0u32,
            &action as *const u32,
        )
    };
    if rc != 0 {
        return Err(format!(
            "seccomp filters cannot return errors here: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Inputs of [`prepare`] for one execution.
#[derive(Debug)]
pub struct Plan<'a> {
    /// Strict settings.
    pub options: &'a StrictOptions,
    /// The interpreter as configured (may be a symlink).
    pub interpreter: &'a Path,
    /// The staging dir (already holding script and stub).
    pub staging: &'a Path,
    /// The script's end of the RPC socketpair.
    pub rpc: OwnedFd,
}

/// What [`prepare`] decided, for logs and `doctor`.
#[derive(Debug, Clone)]
pub struct Summary {
    /// uid the script runs as.
    pub uid: u32,
    /// Closed directories covered in the script's mount namespace so its uid reaches the
    /// interpreter or staging dir without any capability.
    pub covered: Vec<String>,
    /// Paths granted read + execute.
    pub read_execute: Vec<PathBuf>,
    /// The uid's lease (root only): hold it until every process of the execution is gone.
    pub lease: Option<std::sync::Arc<uids::UidLease>>,
}

/// Prepares the confinement of one strict execution (everything but the in-child syscalls).
pub fn prepare(plan: Plan<'_>) -> Result<(ChildConfinement, Summary), ConfineError> {
    let opts = plan.options;
    if let Some(problem) = &opts.invalid {
        return Err(ConfineError::Config(problem.clone()));
    }
    seccomp_available().map_err(ConfineError::Unsupported)?;
    let filters = policy::load_seccomp(opts.seccomp_policy.as_deref())?;
    let ll = policy::load_landlock(opts.landlock_policy.as_deref())?;
    let abi = landlock_abi().map_err(|why| {
        ConfineError::Unsupported(format!(
            "landlock is unavailable: {why}; strict mode needs landlock ABI {}",
            ll.min_abi
        ))
    })?;
    if abi < ll.min_abi {
        return Err(ConfineError::Unsupported(format!(
            "this kernel has landlock ABI {abi}, strict mode needs ABI {} (scoped abstract unix \
             sockets and signals: Linux 6.12 or later)",
            ll.min_abi
        )));
    }

    refuse_script_interpreter(plan.interpreter)?;
    // Looked up once: the rules and the reveal both need them, and the lookup (realpaths, the
    // venv's pyvenv.cfg, the lib dirs) cost about 0.1 ms of every strict preparation.
    let interpreter_files = interpreter_paths(plan.interpreter);
    let read_execute = allowed_read_execute(&ll, &interpreter_files);
    let ruleset = build_ruleset(&ll, &read_execute, plan.staging)?;

    let root = rustix::process::geteuid().is_root();
    let mut lease = None;
    let mut reveal = None;
    let (credentials, uid) = if root {
        if opts.uid == Some(0) {
            return Err(ConfineError::Config(
                "code_execution.strict.uid is 0; the script must not run as root".into(),
            ));
        }
        if opts.uid.is_some() && pool_active() {
            return Err(ConfineError::Config(
                "code_execution.strict.uid pins one uid, but this host keeps a warm pool of \
                 interpreters (code_execution.pool_size), which would run several executions \
                 under it at once; remove code_execution.strict.uid or set \
                 code_execution.pool_size: 0"
                    .into(),
            ));
        }
        let leased = uids::lease(opts.uid, UID_BASE, UID_SPAN)?;
        let uid = leased.uid();
        lease = Some(std::sync::Arc::new(leased));
        let gid = uid;
        hand_over(plan.staging, uid, gid)?;
        reveal = reveal_for(
            plan.staging,
            &read_execute,
            plan.interpreter,
            &interpreter_files,
            uid,
            gid,
        )?;
        (Some(Credentials { uid, gid }), uid)
    } else {
        (None, rustix::process::getuid().as_raw())
    };

    let rlimits = rlimits(opts, credentials.is_some());
    let summary = Summary {
        uid,
        lease,
        covered: reveal
            .as_ref()
            .map(reveal::Reveal::covered)
            .unwrap_or_default(),
        read_execute,
    };
    Ok((
        ChildConfinement {
            ruleset,
            filters,
            credentials,
            rlimits,
            rpc: plan.rpc,
            reveal,
        },
        summary,
    ))
}

/// What the script's uid must reach (the staging dir, the interpreter's granted files) and
/// cannot, revealed through a private mount namespace; see [`reveal`].
fn reveal_for(
    staging: &Path,
    read_execute: &[PathBuf],
    interpreter: &Path,
    interpreter_files: &[PathBuf],
    uid: u32,
    gid: u32,
) -> Result<Option<reveal::Reveal>, ConfineError> {
    let mut needed: Vec<PathBuf> = vec![staging.to_path_buf()];
    for p in interpreter_files.iter().cloned() {
        if !read_execute.contains(&p) {
            continue;
        }
        // A lone binary is revealed with its directory (landlock still grants only the file).
        let dir = if p.is_dir() {
            p
        } else {
            match p.parent() {
                Some(d) => d.to_path_buf(),
                None => continue,
            }
        };
        needed.push(dir);
    }
    needed.sort();
    needed.dedup();
    let outermost: Vec<PathBuf> = needed
        .iter()
        .filter(|n| !needed.iter().any(|o| o != *n && n.starts_with(o)))
        .cloned()
        .collect();
    let plan =
        reveal::Reveal::plan(&outermost, |p| first_unsearchable(p, uid, gid)).map_err(|e| {
            ConfineError::Unreachable(format!(
                "the strict uid cannot reach the interpreter {} or the staging dir {}: {e}; make \
                 their directories searchable (chmod o+x), set code_execution.python to an \
                 interpreter outside closed directories, or set TMPDIR to a searchable directory",
                interpreter.display(),
                staging.display()
            ))
        })?;
    if let Some(r) = &plan {
        tracing::debug!(
            "execute_code: strict uid {uid} cannot search {}; covering it in the script's mount \
             namespace (no capability is kept)",
            r.covered().join(", ")
        );
    }
    Ok(plan)
}

/// A `#!` script as interpreter (a pyenv shim, a wrapper) would need its own interpreter and
/// tools inside the sandbox; say so instead of failing with a bare EACCES at exec.
fn refuse_script_interpreter(interpreter: &Path) -> Result<(), ConfineError> {
    use std::io::Read;
    let mut head = [0u8; 2];
    let is_script = std::fs::File::open(interpreter)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == b"#!";
    if is_script {
        return Err(ConfineError::Unreachable(format!(
            "the interpreter {} is a #! script (a pyenv shim or a wrapper), which cannot run \
             inside the strict sandbox; set code_execution.python to the real executable \
             (for pyenv: the output of `python3 -c 'import sys; print(sys.executable)'`)",
            interpreter.display()
        )));
    }
    Ok(())
}

fn rlimits(opts: &StrictOptions, own_uid: bool) -> Vec<Rlimit> {
    // RLIMIT_NPROC counts every task of the real uid. With a dedicated uid that is exactly the
    // script's tree; without one, the user's other processes count too, so allow for them.
    let nproc = if own_uid {
        opts.max_processes
    } else {
        tasks_of_uid(rustix::process::getuid().as_raw()) + opts.max_processes
    };
    vec![
        (libc::RLIMIT_NPROC, nproc),
        (libc::RLIMIT_DATA, opts.memory_bytes),
        // Address space: a backstop for shared mappings RLIMIT_DATA does not count.
        (libc::RLIMIT_AS, opts.memory_bytes.saturating_mul(4)),
        // No single file beyond the disk budget either (the only disk cap a non-root
        // supervisor has).
        (
            libc::RLIMIT_FSIZE,
            opts.file_size_bytes.min(opts.disk_bytes),
        ),
        (libc::RLIMIT_CORE, 0),
        // Last: the script process applies it after everything that opens descriptors before
        // exec (the mount namespace's trees), which a busy supervisor's inherited table would
        // otherwise push past it.
        (libc::RLIMIT_NOFILE, open_files(opts.memory_bytes)),
    ]
}

/// The processes listed in `/proc`, each with the metadata of its entry (owned by the
/// process's uid). Only a process's entry is stat'ed: the name is checked first, because a stat
/// of one of /proc's many other entries (sys, net, meminfo, ...) costs a lookup for nothing, on
/// every strict execution's lease.
fn processes() -> impl Iterator<Item = (std::fs::DirEntry, std::fs::Metadata)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .as_encoded_bytes()
                .iter()
                .all(u8::is_ascii_digit)
        })
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            Some((entry, meta))
        })
}

/// Which of `uids` own at least one process now, in one pass over `/proc`.
pub(crate) fn uids_in_use(uids: &[u32]) -> Vec<u32> {
    let mut in_use = Vec::new();
    for (_, meta) in processes() {
        let uid = meta.uid();
        if uids.contains(&uid) && !in_use.contains(&uid) {
            in_use.push(uid);
            if in_use.len() == uids.len() {
                break;
            }
        }
    }
    in_use
}

pub(crate) fn tasks_of_uid(uid: u32) -> u64 {
    processes()
        .filter(|(_, meta)| meta.uid() == uid)
        .map(|(entry, _)| {
            std::fs::read_to_string(entry.path().join("status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Threads:"))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(1)
        })
        .sum()
}

/// Gives the staging dir and everything in it to the script's uid.
fn hand_over(staging: &Path, uid: u32, gid: u32) -> Result<(), ConfineError> {
    fn walk(p: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
        if std::fs::symlink_metadata(p)?.is_dir() {
            for entry in std::fs::read_dir(p)? {
                walk(&entry?.path(), uid, gid)?;
            }
        }
        Ok(())
    }
    walk(staging, uid, gid).map_err(io_err(format!(
        "giving the staging dir {} to uid {uid}",
        staging.display()
    )))
}

/// The first ancestor of `path` (or `path` itself for a file) that `uid`/`gid` (no
/// supplementary groups) may not search or execute.
fn first_unsearchable(path: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    let mut p = PathBuf::new();
    for component in path.components() {
        p.push(component);
        let meta = std::fs::metadata(&p).ok()?;
        let mode = meta.mode();
        let bits = if meta.uid() == uid {
            mode >> 6
        } else if meta.gid() == gid {
            mode >> 3
        } else {
            mode
        };
        if bits & 0o1 == 0 {
            return Some(p);
        }
    }
    None
}

/// The policy's read+execute paths plus the interpreter's files.
fn allowed_read_execute(ll: &LandlockPolicy, interpreter_files: &[PathBuf]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ll.read_execute.clone();
    if ll.interpreter {
        paths.extend(interpreter_files.iter().cloned());
    }
    paths.retain(|p| p.exists());
    paths.sort();
    paths.dedup();
    paths
}

fn build_ruleset(
    ll: &LandlockPolicy,
    read_execute: &[PathBuf],
    staging: &Path,
) -> Result<OwnedFd, ConfineError> {
    let abi = ABI::V6;
    let unsupported = |e: landlock::RulesetError| {
        ConfineError::Unsupported(format!("landlock cannot enforce the policy: {e}"))
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(unsupported)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(unsupported)?
        .scope(Scope::from_all(abi))
        .map_err(unsupported)?
        .create()
        .map_err(unsupported)?;
    let read_exec: BitFlags<AccessFs> = AccessFs::from_read(abi);
    let read_write: BitFlags<AccessFs> = AccessFs::from_all(abi);
    let staging_access = match ll.staging {
        StagingAccess::ReadWrite => read_write,
        StagingAccess::ReadOnly => AccessFs::ReadFile | AccessFs::ReadDir,
    };
    let mut grants: Vec<(PathBuf, BitFlags<AccessFs>)> = read_execute
        .iter()
        .map(|p| (p.clone(), read_exec))
        .collect();
    grants.extend(
        ll.read_write
            .iter()
            .filter(|p| p.exists())
            .map(|p| (p.clone(), read_write)),
    );
    grants.push((staging.to_path_buf(), staging_access));
    for (path, access) in grants {
        let fd = PathFd::new(&path).map_err(|e| ConfineError::Io {
            what: format!("opening {} for a landlock rule", path.display()),
            source: std::io::Error::other(e.to_string()),
        })?;
        let access = if path.is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| ConfineError::Io {
                what: format!("adding the landlock rule for {}", path.display()),
                source: std::io::Error::other(e.to_string()),
            })?;
    }
    for (ports, access) in [
        (&ll.tcp_bind, AccessNet::BindTcp),
        (&ll.tcp_connect, AccessNet::ConnectTcp),
    ] {
        for &port in ports {
            ruleset = ruleset
                .add_rule(NetPort::new(port, access))
                .map_err(unsupported)?;
        }
    }
    let fd: Option<OwnedFd> = ruleset.into();
    fd.ok_or_else(|| {
        ConfineError::Unsupported("landlock did not create a ruleset on this kernel".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease's check that a uid runs nothing counts a process of that uid, and stops
    /// counting it once it is gone.
    #[test]
    fn tasks_of_a_uid_are_counted_while_they_live() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            vibeos_testkit::skip!("needs root to start a process as another uid");
        }
        let uid = 54_321;
        assert_eq!(tasks_of_uid(uid), 0, "uid {uid} is in use on this machine");
        let mut child =
            std::os::unix::process::CommandExt::uid(&mut std::process::Command::new("sleep"), uid)
                .arg("30")
                .spawn()
                .expect("sleep starts");
        let mut seen = 0;
        for _ in 0..200 {
            seen = tasks_of_uid(uid);
            if seen > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(seen, 1);
        assert_eq!(tasks_of_uid(uid), 0);
    }

    #[test]
    fn strict_settings_are_read_and_checked() {
        let doc = |text: &str| Config::parse(text, Path::new("/x/config.yaml")).unwrap();
        let o = StrictOptions::from_config(&doc(
            "code_execution:\n  strict:\n    uid: 4242\n    max_processes: 64\n    memory_mb: 512\n",
        ));
        assert_eq!(o.invalid, None);
        assert_eq!(o.uid, Some(4242));
        assert_eq!(o.max_processes, 64);
        assert_eq!(o.memory_bytes, 512 << 20);
        // Wrong types and unknown keys fail the whole file, naming the key path.
        for (bad, path) in [
            ("memory_mb: -1", "code_execution.strict.memory_mb"),
            ("nproc: 3", "code_execution.strict"),
            ("terminal: maybe", "code_execution.strict.terminal"),
            ("read_roots: [[/a]]", "code_execution.strict.read_roots[0]"),
        ] {
            let e = Config::parse(
                &format!("code_execution:\n  strict:\n    {bad}\n"),
                Path::new("/x/config.yaml"),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with(&format!("/x/config.yaml: {path}")),
                "{bad}: {e}"
            );
        }
        let o = StrictOptions::from_config(&doc(
            "code_execution:\n  strict:\n    disk_mb: 64\n    terminal: true\n    \
             read_roots: [/srv/a]\n    write_roots: [/srv/b, /srv/c]\n",
        ));
        assert_eq!(o.invalid, None);
        assert_eq!(o.disk_bytes, 64 << 20);
        assert!(o.terminal);
        assert_eq!(o.read_roots, vec![PathBuf::from("/srv/a")]);
        assert_eq!(o.write_roots.len(), 2);
        for bad in [
            "read_roots: [relative/dir]",
            "write_roots: [/]",
            "disk_mb: 0",
        ] {
            let o = StrictOptions::from_config(&doc(&format!(
                "code_execution:\n  strict:\n    {bad}\n"
            )));
            let key = bad.split(':').next().unwrap();
            assert!(
                o.invalid.as_deref().unwrap_or("").contains(key),
                "{bad}: {o:?}"
            );
        }
        assert_eq!(StrictOptions::default().disk_bytes, DEFAULT_DISK_MB << 20);
        assert!(!StrictOptions::default().terminal);
        assert_eq!(
            StrictOptions::from_config(&Config::default()),
            StrictOptions::default()
        );
    }

    #[test]
    fn a_system_interpreter_does_not_open_usr_bin() {
        let paths = interpreter_paths(Path::new("/usr/bin/python3"));
        if paths.is_empty() {
            return; // No system python here.
        }
        assert!(!paths.iter().any(|p| p == Path::new("/usr")));
        assert!(!paths.iter().any(|p| p == Path::new("/usr/bin")));
    }

    #[test]
    fn a_copied_binary_gets_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let exe = dir.path().join("bin/python3");
        std::fs::write(&exe, b"").unwrap();
        let paths = interpreter_paths(&exe);
        assert_eq!(paths, vec![std::fs::canonicalize(&exe).unwrap()]);
    }

    #[test]
    fn search_permission_is_checked_per_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let inner = dir.path().join("a");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let blocked = first_unsearchable(&inner, UID_BASE, UID_BASE);
        // tempdir's parent (/tmp or TMPDIR) may itself be closed; something at or above
        // dir.path() must be reported.
        assert!(blocked.is_some_and(|b| dir.path().starts_with(&b)));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        if first_unsearchable(dir.path().parent().unwrap(), UID_BASE, UID_BASE).is_none() {
            assert_eq!(first_unsearchable(&inner, UID_BASE, UID_BASE), None);
        }
    }
}
