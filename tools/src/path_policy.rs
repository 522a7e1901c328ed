//! What the tools may reach when a strict-mode script calls them (SPEC §6): paths and hosts.
//!
//! Files: see below. Hosts: [`public_destination`] keeps `web_extract` off loopback, private and
//! link-local addresses, which the script itself cannot reach either.
//!
//! A strict script is confined by landlock and seccomp, but its tool calls run in the
//! supervisor, with the supervisor's rights (root in CI). Without a policy of their own the
//! tools would be the script's way out: `read_file("/etc/shadow")`, `write_file` anywhere. This
//! module is that policy: a set of roots (the staging dir, the session cwd, and the configured
//! `code_execution.strict.read_roots` / `write_roots`), and opening primitives that resolve a
//! path *beneath* one root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from a
//! descriptor of that root, opened once when the execution starts.
//!
//! Why `openat2` and not a check-then-open on path strings: the script runs while its tool
//! calls are served and can swap a checked directory for a symlink in between. With
//! `RESOLVE_BENEATH` the kernel refuses, during the one resolution that opens the file, any
//! absolute symlink, any `..` or relative symlink that climbs above the root, and with
//! `RESOLVE_NO_MAGICLINKS` any `/proc/*/fd`-style link. What is opened is what was checked.
//!
//! Hard links cannot be told apart from the original name, so a link planted inside a root to
//! a secret outside would pass `RESOLVE_BENEATH`. Regular files with more than one link are
//! therefore refused outside the staging dir (where landlock already stops the script from
//! linking anything it cannot read). Writes replace the file by a rename in the resolved
//! parent directory, so a write never lands in another name's inode.

use crate::ToolError;
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Why writing `rel` (a path below `root`, a root other than the staging dir) would let a
/// strict script run code outside the sandbox later, if it would. These are the most direct
/// ways, not all of them: anything a writable project holds may be run by something later
/// (docs/strict-mode.md). Refused: the metadata of a version-control checkout (a
/// `.git/config` `core.fsmonitor` or a hook runs at the next `git status`, as the user), and a
/// directory git would take for a repository by its content (`HEAD` beside `objects/` or
/// `refs/` or `commondir`: a bare repository made from scratch); Python's start-up hooks
/// (the module `sitecustomize` — a file or a package — runs in every interpreter whose path
/// holds its dir — project mode puts the session dir there — and `.pth` files in site dirs);
/// the start-up files of the user's programs when the root is, or holds, a home
/// ([`STARTUP_FILES`] by name, everything in [`STARTUP_DIRS`]). The root's own path counts:
/// a root inside `.git`, `.ssh` or a bare repository is no safer than one above it.
/// vibeos-exec's own places are refused too: a `.vibeos` dir (the project plugin dir
/// `<cwd>/.vibeos/plugins`, and the default home `~/.vibeos` when the root is a home), whose
/// plugins and `config.yaml` (MCP server commands, `code_execution.mode`) every later `run`,
/// `serve` or Python host loads; the home, config file and plugin dirs in use wherever they
/// are are checked by [`PathPolicy`] against the written file's real path.
/// Names are compared without ASCII case (a case-insensitive filesystem opens `.GIT/config`).
///
/// `by_content`: also look into each directory on the way for a repository's entries (a stat
/// per entry and level, so quadratic in the depth); a walk that made the directories itself
/// leaves that to its last check.
fn runs_outside_later(root: &Path, rel: &Path, by_content: bool) -> Option<&'static str> {
    const VCS: [&str; 4] = [".git", ".hg", ".svn", ".bzr"];
    let names: Vec<&str> = rel
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect();
    // The root's own path counts too: a session dir inside a git dir (`--cwd repo/.git/hooks`)
    // or inside `~/.ssh` has no telling name below it.
    let above: Vec<&str> = root
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect();
    let whole: Vec<&str> = above.iter().chain(names.iter()).copied().collect();
    if whole
        .iter()
        .any(|n| VCS.iter().any(|v| n.eq_ignore_ascii_case(v)))
    {
        return Some("it lies in version-control metadata, whose hooks and config run commands");
    }
    if names.iter().any(|n| n.eq_ignore_ascii_case(".vibeos")) {
        return Some(PRODUCT_FILES);
    }
    let file = names.last()?.to_ascii_lowercase();
    if names.iter().any(|n| python_startup_module(n))
        || file.ends_with(".pth")
        || shadows_an_interpreter_startup_module(&names)
    {
        return Some(
            "Python runs it at the start of interpreters that have its directory on their path",
        );
    }
    if STARTUP_FILES.iter().any(|f| file == *f) || in_startup_dir(&whole) {
        return Some(
            "a shell, git, ssh, an editor, the desktop session or direnv runs it or reads \
             commands from it when it starts",
        );
    }
    if !by_content {
        return None;
    }
    // A root inside a bare repository (`--cwd repo.git/hooks`): git finds it by its content
    // from any directory beneath it, so each of the root's ancestors is looked at as well.
    if root.ancestors().any(|dir| {
        dir.join("HEAD").exists()
            && ["objects", "refs", "commondir"]
                .iter()
                .any(|e| dir.join(e).exists())
    }) {
        return Some(
            "it lies in a git repository's directory, whose config and hooks run commands",
        );
    }
    // A repository git finds by its content: each directory on the way, counting the entry
    // the path makes in it as there already (a `HEAD` written beside `objects/`, a dir
    // `refs/` made beside `HEAD`, a file beneath a dir holding both).
    let mut dir = root.to_path_buf();
    for name in &names {
        let has = |entry: &str| name.eq_ignore_ascii_case(entry) || dir.join(entry).exists();
        // `commondir` names the directory git takes `objects/`, `refs/` and the config from.
        if has("HEAD") && (has("objects") || has("refs") || has("commondir")) {
            return Some(
                "it lies in a git repository's directory, whose config and hooks run commands",
            );
        }
        dir.push(name);
    }
    None
}

/// Files a program run later by the user reads commands from, by file name, wherever they lie
/// beneath a root (a root may be a home, or hold one): the shells' rc, login and logout files
/// (bash, sh, zsh, csh/tcsh, ksh), readline's `.inputrc` (its macros type commands), git's and
/// Mercurial's user config (`core.fsmonitor`, `core.pager`, hooks), direnv's `.envrc`, the
/// PAM and X session environments (`.pam_environment`, `.xprofile`, `.xsession`, `.xinitrc`,
/// `.xsessionrc`), the editors' rc files (vim `:!`, nano's `formatter`/`linter`, Emacs
/// Lisp) and npm's (`script-shell`, `node-options`). Compared by whole name, lower-cased: a
/// look-alike (`.bashrc.bak`) is not read by anything and stays writable. docs/strict-mode.md
/// has the list and why.
const STARTUP_FILES: [&str; 34] = [
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".bash_aliases",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".zlogout",
    ".cshrc",
    ".tcshrc",
    ".login",
    ".logout",
    ".kshrc",
    ".mkshrc",
    ".inputrc",
    ".gitconfig",
    ".hgrc",
    ".envrc",
    ".pam_environment",
    ".xprofile",
    ".xsession",
    ".xsessionrc",
    ".xinitrc",
    ".xserverrc",
    ".vimrc",
    ".gvimrc",
    ".exrc",
    ".nanorc",
    ".emacs",
    ".emacs.el",
    ".npmrc",
];

/// Directories whose every file a program run later reads as commands or config that runs
/// commands, as consecutive path components (any case): all of `.ssh` (`authorized_keys`
/// `command=`, `rc`, `config`'s `ProxyCommand`/`LocalCommand`), git's, fish's, Neovim's and
/// direnv's XDG config dirs, the systemd user units, the desktop's autostart entries and
/// `environment.d` (read at log-in), `.local/bin` (first on many users' `PATH`: a `git` there
/// replaces git), and the vim and Emacs config dirs (their plugins load at start).
const STARTUP_DIRS: [&[&str]; 11] = [
    &[".ssh"],
    &[".config", "git"],
    &[".config", "fish"],
    &[".config", "nvim"],
    &[".config", "direnv"],
    &[".config", "systemd"],
    &[".config", "autostart"],
    &[".config", "environment.d"],
    &[".local", "bin"],
    &[".vim"],
    &[".emacs.d"],
];

/// Whether `names` (a path below a root, by component) lies in one of [`STARTUP_DIRS`].
fn in_startup_dir(names: &[&str]) -> bool {
    STARTUP_DIRS.iter().any(|dir| {
        names.windows(dir.len()).any(|w| {
            w.iter()
                .zip(dir.iter())
                .all(|(n, d)| n.eq_ignore_ascii_case(d))
        })
    })
}

/// Why vibeos-exec's own home, config file and plugin dirs are not written in strict mode.
const PRODUCT_FILES: &str =
    "it is vibeos-exec's own config, plugins or logs, which later runs and hosts load";

/// vibeos-exec's own places as they are now: in the home (`$VIBEOS_HOME`, else `~/.vibeos`)
/// its `config.yaml`, `plugins/` and `logs/` (the rest of a home may be a session's cwd), the
/// config file in use, the configured plugin dirs and the configured strict policy files
/// (`code_execution.strict.landlock_policy`, `seccomp_policy`), each in its canonical form
/// (the nearest existing ancestor resolved, the rest appended), so that a write or a read can
/// be compared by the real path the kernel opened.
fn product_places() -> Vec<PathBuf> {
    let home = crate::settings::vibeos_home();
    let mut places = vec![
        home.join("config.yaml"),
        home.join("plugins"),
        home.join("logs"),
        crate::settings::config_path(),
    ];
    if let Ok(file) = crate::settings::current() {
        if let Some(plugins) = &file.plugins {
            places.extend(plugins.dirs.iter().cloned());
        }
        // The strict policies themselves: a script that rewrote the landlock policy (in a
        // write root) loosened the confinement of every strict run after it. A relative path
        // is opened from the supervisor's cwd, so it is compared from there.
        let strict = file.code_execution.as_ref().and_then(|c| c.strict.as_ref());
        let cwd = std::env::current_dir().ok();
        for policy in strict
            .into_iter()
            .flat_map(|s| [&s.landlock_policy, &s.seccomp_policy])
            .flatten()
            .filter(|p| !p.is_empty())
        {
            let policy = PathBuf::from(policy);
            match (&cwd, policy.is_absolute()) {
                (_, true) => places.push(policy),
                (Some(cwd), false) => places.push(cwd.join(policy)),
                (None, false) => {}
            }
        }
    }
    places
        .into_iter()
        .filter(|p| p.is_absolute())
        .map(|p| real_as_far_as_it_exists(&p))
        .collect()
}

/// `path` as the kernel would find it once its missing parts exist: `..` taken by name first
/// (a command may create the dir it steps out of: `mkdir -p x && echo > x/../y`), then the
/// longest existing ancestor canonicalised (symlinks resolved) and the rest appended by name.
/// A path with no existing ancestor comes back cleaned.
pub(crate) fn real_as_far_as_it_exists(path: &Path) -> PathBuf {
    let clean = crate::planner::lexical(path);
    let mut rest = Vec::new();
    let mut at = clean.as_path();
    loop {
        if let Ok(real) = at.canonicalize() {
            let mut out = real;
            out.extend(rest.iter().rev());
            return out;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return clean,
        }
    }
}

/// Whether a path component provides the module `sitecustomize` or `usercustomize`, which
/// `site` imports at every interpreter start: the source or a compiled file
/// (`sitecustomize.py`, `.pyc`, an extension module `sitecustomize.<tag>.so`) or a package
/// directory (`sitecustomize/__init__.py`). A look-alike such as `sitecustomize.py.bak` is
/// not imported and stays writable.
fn python_startup_module(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let (stem, rest) = name.split_once('.').unwrap_or((&name, ""));
    (stem == "sitecustomize" || stem == "usercustomize")
        && (rest.is_empty()
            || [".py", ".pyc", ".pyw", ".so"]
                .iter()
                .any(|s| name.ends_with(s)))
}

/// Modules an interpreter imports from its path as it starts, before any line of a script:
/// what CPython 3.8–3.13 import at start-up without being frozen or built in (`encodings` in
/// every version; `os`, `io`, `site` and their like up to 3.10), and the modules that `.pth`
/// lines of common installations import (setuptools' `_distutils_hack`, virtualenv's
/// `_virtualenv`). Project mode puts the session dir on `PYTHONPATH`, ahead of the standard
/// library, so one of these planted at its top ran in every later project-mode interpreter
/// there, whatever the script (stop 55).
const INTERPRETER_STARTUP_MODULES: [&str; 17] = [
    "encodings",
    "codecs",
    "io",
    "abc",
    "site",
    "os",
    "stat",
    "posixpath",
    "genericpath",
    "ntpath",
    "_collections_abc",
    "_sitebuiltins",
    "_bootlocale",
    "linecache",
    "zipimport",
    "_distutils_hack",
    "_virtualenv",
];

/// Whether `names` (a path below a root) makes the root provide one of the
/// [`INTERPRETER_STARTUP_MODULES`] (or a `__editable__` finder, which editable installs' `.pth`
/// lines import): a module file directly in the root (`encodings.py`, `.pyc`, `.so`) or a
/// regular package's `__init__` (`encodings/__init__.py`). Only the root's top counts (that is
/// the `PYTHONPATH` entry), and only what the import system would take for the module: a
/// plain directory `site/` or a file `os.txt` shadows nothing and stays writable.
fn shadows_an_interpreter_startup_module(names: &[&str]) -> bool {
    let module_file = |name: &str, stem_ok: &dyn Fn(&str) -> bool| {
        let name = name.to_ascii_lowercase();
        name.split_once('.').is_some_and(|(stem, _)| stem_ok(stem))
            && [".py", ".pyc", ".pyw", ".so"]
                .iter()
                .any(|s| name.ends_with(s))
    };
    let startup = |stem: &str| {
        INTERPRETER_STARTUP_MODULES.contains(&stem) || stem.starts_with("__editable__")
    };
    match names {
        [file] => module_file(file, &startup),
        [package, init] => {
            startup(&package.to_ascii_lowercase()) && module_file(init, &|s| s == "__init__")
        }
        _ => false,
    }
}

/// What a root lets the tools do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootAccess {
    /// read_file and search_files only.
    Read,
    /// Also write_file and patch.
    ReadWrite,
}

#[derive(Debug)]
struct Root {
    /// The root as the tools see it (absolute; may contain symlinks, like a session cwd).
    path: PathBuf,
    /// Its canonical form, so a path given either way is matched.
    canonical: PathBuf,
    access: RootAccess,
    /// Whether files with several hard links may be read (the staging dir only).
    links_ok: bool,
    dir: OwnedFd,
}

/// The roots beneath which the file tools act for one strict execution.
#[derive(Debug)]
pub struct PathPolicy {
    roots: Vec<Root>,
    /// Bytes the tools may still write outside the staging dir in this execution (`None`:
    /// unbounded). The staging dir has its own cap (a tmpfs); without this, a script calling
    /// write_file in a loop could fill the disk under the cwd or a write root.
    write_budget: Option<std::sync::atomic::AtomicU64>,
    /// vibeos-exec's own home, config file and plugin dirs ([`product_places`]), never written.
    product_places: Vec<PathBuf>,
}

/// Why a root could not be added (the execution then refuses to start).
#[derive(Debug, thiserror::Error)]
#[error("cannot use {path} as a strict-mode tool root: {reason}")]
pub struct RootError {
    /// The root.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// How many levels of directories the tools write beneath a root other than the staging dir
/// (the root's own depth not counted). Source trees rarely go past 20; each level the tools
/// make takes a block of disk ([`dir_cost`]) and a resolution per call.
pub const MAX_WRITE_DEPTH: usize = 64;

/// The least a file or directory is taken to use on disk (see [`dir_cost`]).
const BLOCK_FLOOR: u64 = 4096;

/// What one new directory takes on disk in the filesystem of `at`, for the write budget: one
/// block (`f_bsize` of `fstatfs`, 4 KiB on ext4 and tmpfs), and never less than 4 KiB —
/// filesystems that report a smaller block (or keep small directories inline) still spend an
/// inode and metadata on it.
fn dir_cost(at: BorrowedFd<'_>) -> u64 {
    nix::sys::statfs::fstatfs(at)
        .ok()
        // The block size is signed with glibc and unsigned with musl.
        .and_then(
            #[allow(clippy::useless_conversion)]
            |st| u64::try_from(st.block_size()).ok(),
        )
        .map_or(BLOCK_FLOOR, |b| b.clamp(BLOCK_FLOOR, 1 << 20))
}

/// What a file of `len` bytes takes on a disk of `block`-byte blocks, for the write budget:
/// whole blocks, and one for an empty file.
fn on_disk(len: u64, block: u64) -> u64 {
    len.div_ceil(block).max(1).saturating_mul(block)
}

/// Prefix of the per-user dir under which every execution's staging dir is made
/// (`<tmp>/vibeos-staging-<euid>`). Strict-mode tools refuse anything beneath one, except the
/// calling execution's own staging dir.
pub const STAGING_PARENT_PREFIX: &str = "vibeos-staging-";

const RESOLVE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH.union(ResolveFlag::RESOLVE_NO_MAGICLINKS);

impl PathPolicy {
    /// An empty policy: no root, every path refused.
    pub fn new() -> Self {
        PathPolicy {
            roots: Vec::new(),
            write_budget: None,
            product_places: product_places(),
        }
    }

    /// Caps what the tools may write outside the staging dir, in bytes, for the execution.
    pub fn set_write_budget(&mut self, bytes: u64) {
        self.write_budget = Some(std::sync::atomic::AtomicU64::new(bytes));
    }

    /// Gives back `len` bytes taken for a write that did not happen.
    fn refund(&self, len: u64) {
        use std::sync::atomic::Ordering;
        if let Some(budget) = &self.write_budget {
            let _ = budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_add(len))
            });
        }
    }

    /// Takes `len` bytes from the write budget if it holds them; `Err` says how many were left.
    /// Without a budget every write fits.
    fn take_from_budget(&self, len: u64) -> Result<(), u64> {
        use std::sync::atomic::Ordering;
        let Some(budget) = &self.write_budget else {
            return Ok(());
        };
        budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(len)
            })
            .map(|_| ())
    }

    /// Takes what `count` new directories take on disk from the write budget (one block of
    /// the filesystem each, [`dir_cost`]), before any is made, or says why not.
    fn charge_dirs(&self, count: u64, at: BorrowedFd<'_>, path: &Path) -> Result<(), ToolError> {
        if self.write_budget.is_none() {
            return Ok(());
        }
        let each = dir_cost(at);
        let len = each.saturating_mul(count);
        self.take_from_budget(len).map_err(|left| {
            ToolError::new(
                crate::ToolErrorKind::DiskBudgetExceeded,
                format!(
                    "the disk budget of this execution cannot hold the {count} new \
                     directories writing {} would make ({each} bytes each on disk, {len} \
                     in all; {left} bytes left for tool writes outside the staging dir, \
                     code_execution.strict.disk_mb sets it); write into an existing \
                     directory or use a shallower path",
                    path.display()
                ),
            )
        })
    }

    /// Takes `charged` bytes from the write budget for writing `len` bytes to `path`, or says
    /// why not, naming both sizes when they differ (a 2-byte file is charged a whole block).
    fn charge(&self, charged: u64, len: u64, path: &Path) -> Result<(), ToolError> {
        self.take_from_budget(charged).map_err(|left| {
            let bytes = |n: u64| {
                if n == 1 {
                    "1 byte".to_string()
                } else {
                    format!("{n} bytes")
                }
            };
            let size = if charged == len {
                bytes(len)
            } else {
                format!("{} ({charged} bytes of disk in whole blocks)", bytes(len))
            };
            ToolError::new(
                crate::ToolErrorKind::DiskBudgetExceeded,
                format!(
                    "writing {size} to {} would pass this execution's disk budget ({left} \
                     bytes left for tool writes outside the staging dir; \
                     code_execution.strict.disk_mb sets it)",
                    path.display()
                ),
            )
        })
    }

    /// Adds a root. `links_ok` marks the staging dir. `/` is refused (it would make the policy
    /// meaningless), and so are paths that are not directories and kernel pseudo-filesystems
    /// (`/proc`, `/sys`, `/dev`, cgroup, debugfs, ...: [`kernel_filesystem`]).
    pub fn add_root(
        &mut self,
        path: &Path,
        access: RootAccess,
        links_ok: bool,
    ) -> Result<(), RootError> {
        let err = |reason: String| RootError {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_absolute() {
            return Err(err("it is not an absolute path".into()));
        }
        let canonical = std::fs::canonicalize(path).map_err(|e| err(e.to_string()))?;
        if canonical == Path::new("/") {
            return Err(err(
                "it is `/`, which would let the tools reach the whole filesystem".into(),
            ));
        }
        let dir = nix::fcntl::open(
            &canonical,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(format!("it cannot be opened as a directory: {e}")))?;
        if let Some(what) = kernel_filesystem(&canonical, dir.as_fd()) {
            return Err(err(format!(
                "it is on {what}, whose files are the kernel's and its processes' (the \
                 supervisor's own among them), not a project's; give a directory on an \
                 ordinary filesystem"
            )));
        }
        self.roots.push(Root {
            path: path.to_path_buf(),
            canonical,
            access,
            links_ok,
            dir,
        });
        Ok(())
    }

    /// One line naming the roots, for errors and logs.
    pub fn describe(&self) -> String {
        if self.roots.is_empty() {
            return "none".into();
        }
        self.roots
            .iter()
            .map(|r| {
                format!(
                    "{} ({})",
                    r.path.display(),
                    match r.access {
                        RootAccess::Read => "read",
                        RootAccess::ReadWrite => "read-write",
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The root `path` lies in (the deepest one that grants `write` when asked) and the rest of
    /// the path below it. Purely lexical: the kernel checks the rest during the open.
    fn locate(&self, path: &Path, write: bool) -> Result<(&Root, PathBuf), ToolError> {
        let mut best: Option<(&Root, PathBuf)> = None;
        for root in &self.roots {
            if write && root.access != RootAccess::ReadWrite {
                continue;
            }
            for base in [&root.path, &root.canonical] {
                if let Ok(rel) = path.strip_prefix(base) {
                    let deeper = best
                        .as_ref()
                        .is_none_or(|(_, r)| rel.components().count() < r.components().count());
                    if deeper {
                        best = Some((root, rel.to_path_buf()));
                    }
                }
            }
        }
        let (root, rel) = best.ok_or_else(|| {
            ToolError::new(
                crate::ToolErrorKind::OutsideSandbox,
                format!(
                    "{} is outside what tools may {} in strict mode ({}); add its \
                     directory to code_execution.strict.{} to open it",
                    path.display(),
                    if write { "write" } else { "read" },
                    self.describe_for(write),
                    if write { "write_roots" } else { "read_roots" },
                ),
            )
        })?;
        if write && !root.links_ok {
            let target = root.canonical.join(&rel);
            let why = if self.product_places.iter().any(|p| target.starts_with(p)) {
                Some(PRODUCT_FILES)
            } else {
                runs_outside_later(&root.canonical, &rel, true)
            };
            if let Some(why) = why {
                return Err(refused_for_running_later(path, why));
            }
        }
        Ok((root, rel))
    }

    fn describe_for(&self, write: bool) -> String {
        let names: Vec<String> = self
            .roots
            .iter()
            .filter(|r| !write || r.access == RootAccess::ReadWrite)
            .map(|r| r.path.display().to_string())
            .collect();
        if names.is_empty() {
            "no root allows it".into()
        } else {
            format!("allowed: {}", names.join(", "))
        }
    }

    /// Opens `rel` beneath `dir` (a root or a directory opened beneath one) with `flags`, and
    /// refuses what lies in another execution's staging dir.
    fn open_beneath(
        &self,
        dir: BorrowedFd<'_>,
        rel: &Path,
        flags: OFlag,
        mode: Mode,
        shown: &Path,
    ) -> Result<OwnedFd, ToolError> {
        let fd = Self::open_beneath_root(dir, rel, flags, mode, shown)?;
        self.refuse_other_staging(&fd, shown)?;
        // A pseudo-filesystem mounted beneath a root (a chroot's `proc`) is no more the
        // project's than one given as the root.
        if let Some(what) = kernel_filesystem_type(fd.as_fd()) {
            return Err(ToolError::new(
                crate::ToolErrorKind::OutsideSandbox,
                format!(
                    "{} is on {what}; in strict mode the tools do not reach kernel \
                     filesystems",
                    shown.display()
                ),
            ));
        }
        Ok(fd)
    }

    /// Refuses `fd` when it lies in one of vibeos-exec's own places ([`product_places`]),
    /// judged by where the kernel opened it (`/proc/self/fd`), so that neither a symlink
    /// inside a root nor another spelling leads around it. They are not read either: the
    /// config holds credentials (MCP server headers, API keys), the logs what earlier runs
    /// did, and a session dir or read root that holds the home (`--cwd ~`) would otherwise
    /// hand them to a strict script. The script's own `open()` cannot reach them: landlock
    /// grants it the staging dir and system paths, not the roots.
    fn refuse_product_place(&self, fd: &OwnedFd, shown: &Path) -> Result<(), ToolError> {
        use std::os::fd::AsRawFd;
        if self.product_places.is_empty() {
            return Ok(());
        }
        let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| ToolError::io(shown, &e))?;
        match self.product_places.iter().find(|p| at.starts_with(p)) {
            None => Ok(()),
            Some(place) => Err(ToolError::new(
                crate::ToolErrorKind::OutsideSandbox,
                format!(
                    "{} is not opened in strict mode, so that a script can neither run code \
                     outside the sandbox nor read secrets through it: it is vibeos-exec's own \
                     config, plugins or logs ({}), which later runs load and which hold \
                     credentials. Read or search beneath another directory, or read it \
                     outside strict mode",
                    shown.display(),
                    place.display()
                ),
            )),
        }
    }

    /// Staging dirs live under `<tmp>/vibeos-staging-<euid>`, and that parent can lie beneath a
    /// root (`TMPDIR=/tmp` with the session cwd `/tmp`, or a write root above it). The tools
    /// run with the supervisor's rights, so without this check a script could read, overwrite
    /// or plant modules in a neighbour's staging dir, which is first on its `sys.path`. Where
    /// the descriptor really is comes from the kernel (`/proc/self/fd`), after the open, so no
    /// spelling of the path and no symlink inside a root leads around it.
    fn refuse_other_staging(&self, fd: &OwnedFd, shown: &Path) -> Result<(), ToolError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| ToolError::io(shown, &e))?;
        let in_staging_area = at.components().any(|c| {
            matches!(c, Component::Normal(n) if n.as_bytes().starts_with(STAGING_PARENT_PREFIX.as_bytes()))
        });
        if !in_staging_area
            || self
                .roots
                .iter()
                .any(|r| r.links_ok && at.starts_with(&r.canonical))
        {
            return Ok(());
        }
        Err(ToolError::new(
            crate::ToolErrorKind::OutsideSandbox,
            format!(
                "{} is in the staging area of vibeos-exec executions ({}), which tools never \
                 reach in strict mode except a script's own staging dir",
                shown.display(),
                at.display()
            ),
        ))
    }

    /// Opens `rel` beneath `dir` with `flags`: the kernel's half of the check.
    fn open_beneath_root(
        dir: BorrowedFd<'_>,
        rel: &Path,
        flags: OFlag,
        mode: Mode,
        shown: &Path,
    ) -> Result<OwnedFd, ToolError> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(RESOLVE);
        loop {
            match openat2(dir, rel, how) {
                Ok(fd) => return Ok(fd),
                Err(Errno::EINTR) | Err(Errno::EAGAIN) => continue,
                Err(e) => return Err(resolve_error(shown, e)),
            }
        }
    }

    /// Opens a file for reading. Directories open too (the caller decides what to do with
    /// them); a regular file with several hard links outside the staging dir is refused.
    pub fn open_read(&self, path: &Path) -> Result<File, ToolError> {
        let (root, rel) = self.locate(path, false)?;
        let fd = self.open_beneath(
            root.dir.as_fd(),
            &rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
            path,
        )?;
        self.refuse_product_place(&fd, path)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| ToolError::io(path, &e))?;
        if meta.is_file() && meta.nlink() > 1 && !root.links_ok {
            return Err(ToolError::new(
                crate::ToolErrorKind::HardLinkRefused,
                format!(
                    "{} has {} hard links; in strict mode tools do not read hard-linked files \
                     outside the staging dir (a link can lead to a file outside the allowed \
                     roots)",
                    path.display(),
                    meta.nlink()
                ),
            ));
        }
        Ok(file)
    }

    /// Checks that `path` exists beneath a readable root (for directory walks, where the
    /// walker lists names by path and each one is checked again before it is reported).
    pub fn check_read(&self, path: &Path) -> Result<std::fs::Metadata, ToolError> {
        let (root, rel) = self.locate(path, false)?;
        let fd = self.open_beneath(root.dir.as_fd(), &rel, OFlag::O_PATH, Mode::empty(), path)?;
        self.refuse_product_place(&fd, path)?;
        File::from(fd)
            .metadata()
            .map_err(|e| ToolError::io(path, &e))
    }

    /// Whether `path` names an existing entry beneath a writable root.
    pub fn exists_for_write(&self, path: &Path) -> Result<bool, ToolError> {
        let (root, rel) = self.locate(path, true)?;
        match self.open_beneath(
            root.dir.as_fd(),
            &rel,
            OFlag::O_PATH | OFlag::O_NOFOLLOW,
            Mode::empty(),
            path,
        ) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == "FileNotFound" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The parent directory of `path` beneath a writable root (created as needed, each level
    /// resolved beneath the root) and the file name in it.
    fn parent_for_write(&self, path: &Path) -> Result<(OwnedFd, std::ffi::OsString), ToolError> {
        let (root, rel) = self.locate(path, true)?;
        let name = match rel.file_name() {
            Some(n) if matches!(rel.components().next_back(), Some(Component::Normal(_))) => {
                n.to_os_string()
            }
            _ => {
                return Err(ToolError::new(
                    crate::ToolErrorKind::IsADirectory,
                    format!("{} is a directory; give a file path", path.display()),
                ))
            }
        };
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        // Every level is a directory the walk may have to make (a block of disk each) and
        // resolve: 2,000 levels per call made 8 MB of directories. Refused before anything is
        // made, with the root's own depth not counted.
        let levels = parent_rel.components().count();
        if !root.links_ok && levels > MAX_WRITE_DEPTH {
            return Err(ToolError::new(
                crate::ToolErrorKind::InvalidArguments,
                format!(
                    "in strict mode the tools write at most {MAX_WRITE_DEPTH} levels of \
                     directories beneath a root (each one they make takes disk), and {} lies \
                     {levels} levels beneath {}; use a shallower path",
                    path.display(),
                    root.path.display()
                ),
            ));
        }
        // A `..` that climbs above the root fails the walk below, but only after the levels
        // before it were made: refused here, before anything is made.
        let mut depth = 0usize;
        for component in parent_rel.components() {
            match component {
                Component::Normal(_) => depth += 1,
                Component::ParentDir if depth == 0 => {
                    return Err(ToolError::new(
                        crate::ToolErrorKind::OutsideSandbox,
                        format!(
                            "{} climbs above {} with `..`; give a path beneath it",
                            path.display(),
                            root.path.display()
                        ),
                    ))
                }
                Component::ParentDir => depth -= 1,
                _ => {}
            }
        }
        let mut walked = PathBuf::new();
        let mut dir = self.open_beneath(
            root.dir.as_fd(),
            Path::new("."),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
            &root.path,
        )?;
        // Once a level was made here, the levels below it are new too: each is made and
        // opened in the one before, not looked up from the root again (a walk from the root
        // per level, and the content check of every level above, made a path of 1,000 new
        // levels cost 16 s of the host's CPU; 2,000 did not end in 100 s).
        let mut made_here = false;
        for (at, component) in parent_rel.components().enumerate() {
            walked.push(component);
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
            let existing = if made_here {
                Err(ToolError::new(crate::ToolErrorKind::FileNotFound, ""))
            } else {
                self.open_beneath(root.dir.as_fd(), &walked, flags, Mode::empty(), path)
            };
            match existing {
                Ok(fd) => dir = fd,
                Err(e) if e.kind == "FileNotFound" => {
                    let Component::Normal(part) = component else {
                        return Err(e);
                    };
                    // The last check below looks into every level again, these included.
                    self.refuse_what_runs_later(&dir, root, part, path, !made_here)?;
                    // From the first missing level on, every level is made: all of them are
                    // charged at once, before the first is made, so a path the budget cannot
                    // hold leaves nothing behind. (A `..` among them fails the walk above.)
                    if !made_here && !root.links_ok {
                        let new_levels = (parent_rel.components().count() - at) as u64;
                        self.charge_dirs(new_levels, dir.as_fd(), path)?;
                    }
                    match nix::sys::stat::mkdirat(
                        dir.as_fd(),
                        part,
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(err) => {
                            return Err(ToolError::io(&root.path.join(&walked), &err.into()))
                        }
                    }
                    follow_owner(dir.as_fd(), part);
                    made_here = true;
                    dir = self.open_beneath(
                        dir.as_fd(),
                        Path::new(part),
                        flags | OFlag::O_NOFOLLOW,
                        Mode::empty(),
                        path,
                    )?;
                }
                Err(e) => return Err(e),
            }
        }
        self.refuse_what_runs_later(&dir, root, &name, path, true)?;
        Ok((dir, name))
    }

    /// The check of [`runs_outside_later`] and of vibeos-exec's own places again, on the real
    /// path of `name` in a directory the walk opened (`/proc/self/fd`), for the file and for
    /// each directory the walk is about to make: a symlink inside a root (`cfg -> .git`,
    /// `conf -> ~/.vibeos`) leads the kernel's open where the path's spelling does not.
    fn refuse_what_runs_later(
        &self,
        dir: &OwnedFd,
        root: &Root,
        name: &std::ffi::OsStr,
        shown: &Path,
        by_content: bool,
    ) -> Result<(), ToolError> {
        use std::os::fd::AsRawFd;
        if root.links_ok {
            return Ok(());
        }
        let at = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .map_err(|e| ToolError::io(shown, &e))?
            .join(name);
        let why = if self.product_places.iter().any(|p| at.starts_with(p)) {
            Some(PRODUCT_FILES)
        } else {
            at.strip_prefix(&root.canonical)
                .ok()
                .and_then(|rel| runs_outside_later(&root.canonical, rel, by_content))
        };
        match why {
            None => Ok(()),
            Some(why) => Err(refused_for_running_later(shown, why)),
        }
    }

    /// Replaces (or creates) the file at `path` with `content`, atomically: a new file is
    /// written beside it with `O_CREAT|O_EXCL|O_NOFOLLOW` and renamed over it within the
    /// resolved parent. An existing entry's mode is kept; a symlink or directory there is
    /// refused. Returns whether the file was created.
    pub fn write_atomic(&self, path: &Path, content: &[u8]) -> Result<bool, ToolError> {
        let (in_staging, block) = match self.locate(path, true) {
            Ok((root, _)) => (root.links_ok, dir_cost(root.dir.as_fd())),
            // Refused by the write itself: no root holds the path.
            Err(_) => (false, BLOCK_FLOOR),
        };
        // What the disk holds more once the file is replaced, in whole blocks and at least
        // one a file (its inode and metadata): counted by content length, 40,000 one-byte
        // files left 158 MB under a 1 MB budget. A regular file no other name keeps is freed
        // by the rename, so rewriting a file with the same text takes nothing more (it was
        // charged in full each time, and refused once the budget was spent). Charged before
        // the walk makes any directory, so a refused call leaves nothing.
        let charged = if in_staging {
            0
        } else {
            let freed = self
                .size_freed_by_replacing(path)
                .map_or(0, |size| on_disk(size, block));
            on_disk(content.len() as u64, block).saturating_sub(freed)
        };
        self.charge(charged, content.len() as u64, path)?;
        let written = self.replace_file(path, content);
        if written.is_err() {
            self.refund(charged);
        }
        written
    }

    /// The size of the regular file at `path` that only this name keeps (replacing it frees
    /// it), if there is one; nothing is made or followed on the way.
    fn size_freed_by_replacing(&self, path: &Path) -> Option<u64> {
        let Ok((root, rel)) = self.locate(path, true) else {
            return None;
        };
        let Ok(fd) = self.open_beneath(
            root.dir.as_fd(),
            &rel,
            OFlag::O_PATH | OFlag::O_NOFOLLOW,
            Mode::empty(),
            path,
        ) else {
            return None;
        };
        match nix::sys::stat::fstat(fd.as_fd()) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 1 => {
                u64::try_from(st.st_size).ok()
            }
            _ => None,
        }
    }

    /// [`Self::write_atomic`] once the budget was charged.
    fn replace_file(&self, path: &Path, content: &[u8]) -> Result<bool, ToolError> {
        let (dir, name) = self.parent_for_write(path)?;
        let existing = nix::sys::stat::fstatat(
            dir.as_fd(),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        let mode = match existing {
            Ok(st) => {
                let kind = st.st_mode & libc::S_IFMT;
                if kind == libc::S_IFDIR {
                    return Err(ToolError::new(
                        crate::ToolErrorKind::IsADirectory,
                        format!("{} is a directory; give a file path", path.display()),
                    ));
                }
                if kind != libc::S_IFREG {
                    return Err(ToolError::new(
                        crate::ToolErrorKind::NotARegularFile,
                        format!(
                            "{} is a symlink, device, FIFO or socket; in strict mode tools \
                             only write regular files",
                            path.display()
                        ),
                    ));
                }
                Some((st.st_mode & 0o7777 & !0o6000, st.st_uid, st.st_gid))
            }
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(ToolError::io(path, &e.into())),
        };

        // O_EXCL makes a name the script planted (or raced in) fail instead of being reused.
        let (tmp_name, tmp) = {
            let mut attempt = 0;
            loop {
                let name = temp_name();
                match self.open_beneath(
                    dir.as_fd(),
                    Path::new(&name),
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
                    Mode::from_bits_truncate(0o600),
                    path,
                ) {
                    Ok(fd) => break (name, fd),
                    Err(e) if e.kind == "AlreadyExists" && attempt < 8 => attempt += 1,
                    Err(e) => return Err(e),
                }
            }
        };
        let mut file = File::from(tmp);
        let written = file
            .write_all(content)
            .and_then(|_| file.flush())
            .and_then(|_| {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(
                    mode.map_or(0o644, |(m, _, _)| m),
                ))
            });
        let renamed = written.map_err(|e| ToolError::io(path, &e)).and_then(|_| {
            match mode {
                // A replaced file keeps its owner, as an edit in place would.
                Some((_, uid, gid)) => keep_owner(&file, uid, gid),
                None => follow_owner(dir.as_fd(), Path::new(&tmp_name).as_os_str()),
            }
            nix::fcntl::renameat(
                dir.as_fd(),
                tmp_name.as_str(),
                dir.as_fd(),
                name.as_os_str(),
            )
            .map_err(|e| ToolError::io(path, &e.into()))
        });
        if let Err(e) = renamed {
            let _ = nix::unistd::unlinkat(
                dir.as_fd(),
                tmp_name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(e);
        }
        Ok(mode.is_none())
    }

    /// Removes the regular file at `path` (beneath a writable root).
    pub fn remove_file(&self, path: &Path) -> Result<(), ToolError> {
        self.unlink(path, nix::unistd::UnlinkatFlags::NoRemoveDir)
    }

    /// Removes the directory at `path` if it is empty, beneath a writable root (the undo of
    /// a walk that made it).
    pub fn remove_empty_dir(&self, path: &Path) -> Result<(), ToolError> {
        self.unlink(path, nix::unistd::UnlinkatFlags::RemoveDir)
    }

    /// `unlinkat` of `path`'s name in its parent, opened beneath a writable root.
    fn unlink(&self, path: &Path, flags: nix::unistd::UnlinkatFlags) -> Result<(), ToolError> {
        let (dir, name) = self.parent_for_write(path)?;
        nix::unistd::unlinkat(dir.as_fd(), name.as_os_str(), flags)
            .map_err(|e| ToolError::io(path, &e.into()))
    }
}

impl Default for PathPolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether `dir` (opened at `canonical`) is on a kernel pseudo-filesystem, and which: by its
/// filesystem type ([`kernel_filesystem_type`]), and by path beneath `/proc`, `/sys` and `/dev`
/// (devtmpfs says it is a tmpfs; `/dev/shm`, an ordinary tmpfs for files, stays usable — a
/// root supervisor's staging dirs live there).
fn kernel_filesystem(canonical: &Path, dir: BorrowedFd<'_>) -> Option<&'static str> {
    if let Some(what) = kernel_filesystem_type(dir) {
        return Some(what);
    }
    if canonical.starts_with("/proc") {
        return Some("/proc");
    }
    if canonical.starts_with("/sys") {
        return Some("/sys");
    }
    if canonical.starts_with("/dev") && !canonical.starts_with("/dev/shm") {
        return Some("/dev");
    }
    None
}

/// The name of the kernel pseudo-filesystem `fd` lies on (`fstatfs`), if it does: their files
/// are the kernel's view of processes, devices and settings — the supervisor's own `/proc`
/// files among them — and writing some of them changes the machine.
fn kernel_filesystem_type(fd: BorrowedFd<'_>) -> Option<&'static str> {
    // From <linux/magic.h>.
    const KINDS: [(i64, &str); 19] = [
        (0x9fa0, "procfs (/proc)"),
        (0x6265_6572, "sysfs (/sys)"),
        (0x1cd1, "devpts"),
        (0x0027_e0eb, "a cgroup filesystem"),
        (0x6367_7270, "a cgroup2 filesystem"),
        (0x6462_6720, "debugfs"),
        (0x7472_6163, "tracefs"),
        (0x7363_6673, "securityfs"),
        (0xcafe_4a11, "the bpf filesystem"),
        (0x6265_6570, "configfs"),
        (0x1980_0202, "mqueue"),
        (0x6165_676c, "pstore"),
        (0xde5e_81e4, "efivarfs"),
        (0x6573_5543, "fusectl"),
        (0x4249_4e4d, "binfmt_misc"),
        (0xf97c_ff8c, "selinuxfs"),
        (0x4341_5d53, "smackfs"),
        (0x0765_5821, "resctrl"),
        (0x6e73_6673, "nsfs"),
    ];
    let st = nix::sys::statfs::fstatfs(fd).ok()?;
    #[allow(clippy::unnecessary_cast)]
    let kind = st.filesystem_type().0 as i64;
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, name)| *name)
}

/// A fresh name for the file a write goes to before its rename.
/// The refusal of a write that would let a strict script run code outside the sandbox later.
fn refused_for_running_later(path: &Path, why: &str) -> ToolError {
    ToolError::new(
        crate::ToolErrorKind::OutsideSandbox,
        format!(
            "{} is not written in strict mode: {why}, so a script could run code outside the \
             sandbox through it. Write elsewhere, or make the change outside strict mode",
            path.display()
        ),
    )
}

fn temp_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        ".vibeos-write-{}-{}-{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Gives an entry the supervisor created inside a directory to that directory's owner, so a
/// strict script (which owns its staging dir) can change what the tools wrote for it. Nothing
/// happens when the owners already match or when we may not chown (not root).
fn follow_owner(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) {
    let Ok(parent) = nix::sys::stat::fstat(dir) else {
        return;
    };
    if !rustix::process::geteuid().is_root() || parent.st_uid == 0 {
        return;
    }
    let _ = nix::unistd::fchownat(
        dir,
        name,
        Some(nix::unistd::Uid::from_raw(parent.st_uid)),
        Some(nix::unistd::Gid::from_raw(parent.st_gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
}

/// Gives `file` (the new copy a write renames over a file) the owner `uid`/`gid` of the file it
/// replaces, as an edit in place would keep it: a root supervisor editing a user's checkout made
/// their files root's, which the user could then no longer write. Only root can give a file
/// away; otherwise nothing changes.
pub(crate) fn keep_owner(file: &File, uid: u32, gid: u32) {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let _ = nix::unistd::fchown(
        file,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    );
}

/// A resolution failure, worded for the caller.
fn resolve_error(path: &Path, e: Errno) -> ToolError {
    match e {
        Errno::EXDEV => ToolError::new(
            crate::ToolErrorKind::OutsideSandbox,
            format!(
                "{} leads out of its allowed root (through `..`, an absolute symlink or a \
                 mount); in strict mode tools only act beneath the allowed roots",
                path.display()
            ),
        ),
        Errno::ELOOP => ToolError::new(
            crate::ToolErrorKind::OutsideSandbox,
            format!(
                "{} goes through a /proc magic link or a symlink loop; strict-mode tools \
                 refuse it",
                path.display()
            ),
        ),
        Errno::ENOSYS => ToolError::new(
            crate::ToolErrorKind::Unsupported,
            "this kernel has no openat2 (Linux 5.6+), which strict-mode file tools need",
        ),
        other => ToolError::io(path, &std::io::Error::from(other)),
    }
}

impl PathPolicy {
    /// Number of roots.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Whether there is no root.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}

/// Checks that `url` (http or https) names a host whose every address is public: no
/// loopback, private, link-local, shared (CGNAT), unspecified, broadcast, multicast or
/// documentation range, v4 or v6 (v4-mapped included). A strict script's `web_extract` may
/// only reach those — otherwise the tool would be its way to the machine's own services and
/// the cloud metadata endpoint. The name is resolved here and again by the HTTP client; a DNS
/// answer that changes in between (rebinding) is the residual risk, documented.
pub fn public_destination(url: &str) -> Result<(), String> {
    use std::net::{IpAddr, ToSocketAddrs};
    // The URL as the HTTP client reads it (the WHATWG parser reqwest uses): splitting the text
    // by hand took `http://127.0.0.1:80\\@1.1.1.1/` for a fetch from 1.1.1.1, where the client
    // reads `\\` as the end of the host and connects to 127.0.0.1.
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("not a URL the fetch can use: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("only http:// and https:// URLs can be fetched".into());
    }
    let port = parsed.port_or_known_default().unwrap_or(80);
    // The parser writes an address literal in one canonical form (`127.1` and `0x7f.1` are
    // `127.0.0.1`, a v6 one is bracketed).
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("the URL has no host")?
        .to_string();
    // `localhost`, `localhost.` and any `*.localhost` name loopback (RFC 6761) however the
    // resolver would answer; refused before any lookup, so the name never reaches DNS (a
    // trailing dot skips /etc/hosts and asks the network).
    if names_loopback(&host) {
        return Err(loopback_name(&host));
    }
    let literal = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let addrs: Vec<IpAddr> = match literal {
        Some(ip) => vec![ip],
        None => (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .map(|a| a.ip())
            .collect(),
    };
    match addrs.iter().find(|ip| !is_public(**ip)) {
        Some(ip) => Err(format!(
            "{host} resolves to {ip}, a loopback, private or link-local address; a strict-mode \
             script may only fetch public hosts"
        )),
        None if addrs.is_empty() => Err(format!("{host} has no address")),
        None => Ok(()),
    }
}

/// Whether `host` is `localhost` or a name beneath it, in any case and with or without the
/// trailing dot of a fully qualified name: RFC 6761 reserves them all for loopback.
pub fn names_loopback(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

fn loopback_name(host: &str) -> String {
    format!(
        "{host} names the loopback interface (localhost); a strict-mode script may only fetch \
         public hosts"
    )
}

/// Whether `ip` is a public unicast address: not loopback, private, link-local, shared
/// (CGNAT), unspecified, broadcast, multicast, reserved or documentation, and no v6 form of
/// one of those (v4-mapped `::ffff:a.b.c.d`, v4-compatible `::a.b.c.d`, SIIT's v4-translated
/// `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`,
/// 6to4 `2002::/16` carry a v4 address; Teredo, site-local, ULA and discard-only ranges are
/// refused whole).
pub fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    fn v4_ok(ip: Ipv4Addr) -> bool {
        let o = ip.octets();
        !(ip.is_loopback()
            || ip.is_private()
            || ip.is_link_local()
            || ip.is_unspecified()
            || ip.is_broadcast()
            || ip.is_multicast()
            || ip.is_documentation()
            || o[0] == 0
            || (o[0] == 100 && (o[1] & 0xc0) == 64)
            || (o[0] == 198 && (o[1] & 0xfe) == 18)
            // IETF protocol assignments (192.0.0.0/24) and the retired 6to4 relay anycast.
            || (o[0] == 192 && o[1] == 0 && o[2] == 0)
            || (o[0] == 192 && o[1] == 88 && o[2] == 99)
            || o[0] >= 240)
    }
    match ip {
        IpAddr::V4(v4) => v4_ok(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4_ok(v4);
            }
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            // v4-compatible (deprecated, `::a.b.c.d`; `::` and `::1` are caught below).
            if s[..6] == [0; 6] && (s[6] != 0 || s[7] > 1) {
                return v4_ok(embedded(s[6], s[7]));
            }
            // SIIT's v4-translated form (`::ffff:0:a.b.c.d`): a translator hands it on as v4.
            if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
                return v4_ok(embedded(s[6], s[7]));
            }
            // NAT64, well-known prefix: a gateway forwards to the v4 address inside.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return v4_ok(embedded(s[6], s[7]));
            }
            // 6to4: the v4 address of the relay's far side.
            if s[0] == 0x2002 {
                return v4_ok(embedded(s[1], s[2]));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (s[0] == 0x2001 && s[1] == 0)
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                || (s[..4] == [0x100, 0, 0, 0]))
        }
    }
}

/// The name resolver of a strict script's fetches: it resolves as the system does and refuses
/// a name with any address that is not public ([`is_public`]). The check before the fetch
/// ([`public_destination`]) resolves the name once; the client resolves it again to connect,
/// and an answer that changed in between (DNS rebinding) would have slipped past. Here the
/// addresses checked are the addresses connected to.
pub struct PublicOnlyResolver;

impl reqwest::dns::Resolve for PublicOnlyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            if names_loopback(&host) {
                return Err(loopback_name(&host).into());
            }
            let addrs: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
                return Err(format!(
                    "{host} resolves to {}, a loopback, private or link-local address; a \
                     strict-mode script may only fetch public hosts",
                    bad.ip()
                )
                .into());
            }
            if addrs.is_empty() {
                return Err(format!("{host} has no address").into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "path_policy/homes_roots_and_own_files.rs"]
mod homes_roots_and_own_files;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PathPolicy) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("root")).unwrap();
        std::fs::write(d.path().join("secret"), "SECRET").unwrap();
        std::fs::write(d.path().join("root/ok.txt"), "fine").unwrap();
        let mut p = PathPolicy::new();
        p.add_root(&d.path().join("root"), RootAccess::ReadWrite, false)
            .unwrap();
        (d, p)
    }

    #[test]
    fn strict_fetches_reach_public_hosts_only() {
        for url in [
            "http://127.0.0.1:8080/x",
            "http://localhost/",
            "https://[::1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.1.2.3/",
            "http://user@192.168.0.1:81/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0/",
            // The client reads `\\` as the end of the host: 127.0.0.1 is what it would reach.
            "http://127.0.0.1:18777\\@1.1.1.1/",
            "http://169.254.169.254\\@1.1.1.1/latest/meta-data/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://[::7f00:1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:7f00:1::]/",
            "http://[fec0::1]/",
            // Stop 60's probe: not refused before.
            "http://192.0.0.8/",
            "http://[::ffff:0:7f00:1]:18881/",
            "http://192.88.99.1/",
            "file:///etc/passwd",
            "http:///nohost",
        ] {
            assert!(public_destination(url).is_err(), "{url}");
        }
        assert!(
            public_destination("http://1.1.1.1\\@127.0.0.1/").is_ok(),
            "the client reads 1.1.1.1"
        );
        assert!(public_destination("http://8.8.8.8/").is_ok());
        // Loopback by name, refused before any resolution: the error says so (a lookup that
        // failed or answered 127.0.0.1 would say `cannot resolve` or `resolves to`).
        for url in [
            "http://localhost.:8080/",
            "http://LOCALHOST./",
            "http://LocalHost:1/",
            "http://api.localhost/",
            "http://x.y.Localhost.:9/",
        ] {
            let e = public_destination(url).unwrap_err();
            assert!(e.contains("names the loopback"), "{url}: {e}");
        }
        assert!(!names_loopback("notlocalhost"));
        assert!(!names_loopback("localhost.example.com"));
        assert!(!names_loopback("localhostx."));
        assert!(public_destination("https://[2606:4700::1111]:8443/").is_ok());
    }

    #[test]
    fn files_that_run_code_outside_later_are_not_written_beneath_a_root() {
        let (d, p) = setup();
        let root = d.path().join("root");
        for bad in [
            ".git/config",
            ".git/hooks/pre-commit",
            "sub/.hg/hgrc",
            "sitecustomize.py",
            "lib/usercustomize.py",
            "sitecustomize/__init__.py",
            "UserCustomize/__init__.py",
            "sitecustomize.pyc",
            "sitecustomize.cpython-311-x86_64-linux-gnu.so",
            "evil.pth",
            ".envrc",
            ".GIT/config",
            "home/.bashrc",
            ".gitconfig",
            ".vibeos/plugins/p.py",
            "sub/.VIBEOS/config.yaml",
        ] {
            let e = p.write_atomic(&root.join(bad), b"x").unwrap_err();
            assert_eq!(e.kind, "OutsideSandbox", "{bad}: {e:?}");
            assert!(e.message.contains("run code"), "{bad}: {}", e.message);
        }
        assert!(!root.join("sitecustomize.py").exists());
        // Look-alikes are ordinary files; reading those names stays allowed.
        for ok in [
            "gitconfig.txt",
            "sitecustomize.py.bak",
            "sitecustomize_notes.md",
            "docs/.github-notes",
        ] {
            p.write_atomic(&root.join(ok), b"x").unwrap();
        }
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        assert!(p.open_read(&root.join(".git/HEAD")).is_ok());
        // A symlink inside the root that leads into `.git`: the real path is checked too.
        std::os::unix::fs::symlink(".git", root.join("g")).unwrap();
        let e = p.write_atomic(&root.join("g/config"), b"x").unwrap_err();
        assert!(e.message.contains("run code"), "{}", e.message);
        assert!(p.write_atomic(&root.join("g/hooks/h"), b"x").is_err());
        assert!(!root.join(".git/hooks").exists());
        // A bare repository made from scratch, in either order: the step that completes it
        // (and everything after) is refused.
        p.write_atomic(&root.join("bare/config"), b"[core]")
            .unwrap();
        p.write_atomic(&root.join("bare/objects/x"), b"x").unwrap();
        assert!(p
            .write_atomic(&root.join("bare/HEAD"), b"ref: refs/heads/main\n")
            .is_err());
        p.write_atomic(&root.join("bare2/HEAD"), b"ref: refs/heads/main\n")
            .unwrap();
        assert!(p
            .write_atomic(&root.join("bare2/refs/heads/main"), b"0")
            .is_err());
        assert!(p.write_atomic(&root.join("bare2/objects/x"), b"x").is_err());
        // Or made through `commondir`, which points git at objects/, refs/ and the config
        // elsewhere: the file that joins it to a HEAD is refused, in either order.
        p.write_atomic(&root.join("common/objects/x"), b"x")
            .unwrap();
        p.write_atomic(&root.join("common/refs/x"), b"x").unwrap();
        p.write_atomic(&root.join("wt/HEAD"), b"ref: refs/heads/main\n")
            .unwrap();
        assert!(p
            .write_atomic(&root.join("wt/commondir"), b"../common\n")
            .is_err());
        p.write_atomic(&root.join("wt2/commondir"), b"../common\n")
            .unwrap();
        assert!(p
            .write_atomic(&root.join("wt2/HEAD"), b"ref: refs/heads/main\n")
            .is_err());
    }

    #[test]
    fn kernel_pseudo_filesystems_are_not_roots() {
        let mut p = PathPolicy::new();
        for path in [
            "/proc",
            "/proc/self",
            "/sys",
            "/sys/fs/cgroup",
            "/dev",
            "/dev/pts",
        ] {
            if !Path::new(path).is_dir() {
                continue;
            }
            let e = p
                .add_root(Path::new(path), RootAccess::Read, false)
                .unwrap_err();
            assert!(e.reason.contains("kernel"), "{path}: {e}");
        }
        if Path::new("/dev/shm").is_dir() {
            p.add_root(Path::new("/dev/shm"), RootAccess::Read, false)
                .unwrap();
        }
        assert!(kernel_filesystem_type(
            nix::fcntl::open("/proc", OFlag::O_PATH, Mode::empty())
                .unwrap()
                .as_fd()
        )
        .is_some());
        let d = tempfile::tempdir().unwrap();
        assert!(kernel_filesystem_type(
            nix::fcntl::open(d.path(), OFlag::O_PATH, Mode::empty())
                .unwrap()
                .as_fd()
        )
        .is_none());
    }

    #[test]
    fn the_connect_time_resolver_refuses_names_of_private_addresses() {
        use reqwest::dns::Resolve;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let resolve = |name: &str| {
            let name: reqwest::dns::Name = name.parse().unwrap();
            rt.block_on(PublicOnlyResolver.resolve(name))
                .map(|addrs| addrs.count())
                .map_err(|e| e.to_string())
        };
        let e = resolve("localhost").unwrap_err();
        assert!(e.contains("public hosts"), "{e}");
        // Refused by name, before any lookup (`localhost.` would go to DNS).
        for name in ["localhost.", "LocalHost.", "a.b.localhost."] {
            let e = resolve(name).unwrap_err();
            assert!(e.contains("names the loopback"), "{name}: {e}");
        }
        assert!(resolve("name.that-does-not-resolve.invalid").is_err());
    }

    #[test]
    fn reads_beneath_and_refuses_escapes() {
        let (d, p) = setup();
        let root = d.path().join("root");
        assert!(p.open_read(&root.join("ok.txt")).is_ok());
        let e = p.open_read(&root.join("../secret")).unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
        let e = p.open_read(&d.path().join("secret")).unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("rel")).unwrap();
        for name in ["abs", "rel"] {
            let e = p.open_read(&root.join(name)).unwrap_err();
            assert_eq!(e.kind, "OutsideSandbox", "{name}: {e}");
        }
        std::fs::hard_link(d.path().join("secret"), root.join("hard")).unwrap();
        let e = p.open_read(&root.join("hard")).unwrap_err();
        assert_eq!(e.kind, "HardLinkRefused", "{e}");
        let e = p
            .open_read(Path::new("/proc/self/root/etc/passwd"))
            .unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
    }

    #[test]
    fn writes_replace_files_and_never_follow_links() {
        let (d, mut p) = setup();
        let root = d.path().join("root");
        assert!(p.write_atomic(&root.join("new/deep/f.txt"), b"x").unwrap());
        assert_eq!(
            std::fs::read_to_string(root.join("new/deep/f.txt")).unwrap(),
            "x"
        );
        assert!(!p.write_atomic(&root.join("ok.txt"), b"y").unwrap());
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("link")).unwrap();
        assert!(p.write_atomic(&root.join("link"), b"z").is_err());
        std::os::unix::fs::symlink(d.path(), root.join("dirlink")).unwrap();
        let e = p
            .write_atomic(&root.join("dirlink/secret"), b"z")
            .unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
        std::fs::hard_link(d.path().join("secret"), root.join("hard")).unwrap();
        p.write_atomic(&root.join("hard"), b"replaced").unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("secret")).unwrap(),
            "SECRET"
        );
        assert!(p.add_root(Path::new("/"), RootAccess::Read, false).is_err());
        // Files are charged what they take on disk: whole blocks, one at least (40,000
        // one-byte files were charged 40,000 bytes). Rewriting one in place takes nothing.
        let block = dir_cost(p.roots[0].dir.as_fd());
        p.set_write_budget(block * 2 + 10);
        p.write_atomic(&root.join("b1"), b"123456").unwrap();
        p.write_atomic(&root.join("b0"), b"").unwrap();
        p.write_atomic(&root.join("b1"), b"654321").unwrap();
        let e = p.write_atomic(&root.join("b2"), b"1").unwrap_err();
        assert_eq!(e.kind, "DiskBudgetExceeded", "{e}");
        assert!(
            e.message.contains(&format!(
                "writing 1 byte ({block} bytes of disk in whole blocks)"
            )),
            "{e}"
        );
        assert!(!root.join("b2").exists());
        // The directories a write makes count too, all charged before the first is made.
        let mut dirs = PathPolicy::new();
        dirs.add_root(&root, RootAccess::ReadWrite, false).unwrap();
        let each = dir_cost(dirs.roots[0].dir.as_fd());
        // Two directories and a file's block.
        dirs.set_write_budget(each * 4);
        dirs.write_atomic(&root.join("n1/n2/f"), b"").unwrap();
        let e = dirs.write_atomic(&root.join("n3/n4/f"), b"").unwrap_err();
        assert_eq!(e.kind, "DiskBudgetExceeded", "{e}");
        assert!(e.message.contains("the 2 new directories"), "{e}");
        assert!(!root.join("n3").exists(), "a refused walk made a directory");
        // Existing levels cost nothing; the file's block that was refused is given back.
        dirs.write_atomic(&root.join("n1/n2/g"), b"").unwrap();
        let e = dirs.write_atomic(&root.join("n1/n5/f"), b"").unwrap_err();
        assert_eq!(e.kind, "DiskBudgetExceeded", "{e}");
        let deep = format!("{}x", "d/".repeat(MAX_WRITE_DEPTH + 1));
        let mut unbounded = PathPolicy::new();
        unbounded
            .add_root(&root, RootAccess::ReadWrite, false)
            .unwrap();
        let e = unbounded.write_atomic(&root.join(&deep), b"").unwrap_err();
        assert!(e.message.contains("levels of directories"), "{e}");
        assert!(!root.join("d").exists());
        let ok = format!("{}x", "d/".repeat(MAX_WRITE_DEPTH));
        unbounded.write_atomic(&root.join(&ok), b"").unwrap();
        let mut ro = PathPolicy::new();
        ro.add_root(&root, RootAccess::Read, false).unwrap();
        assert_eq!(
            ro.write_atomic(&root.join("ok.txt"), b"no")
                .unwrap_err()
                .kind,
            "OutsideSandbox"
        );
    }
}
