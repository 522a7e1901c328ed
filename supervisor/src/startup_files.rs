//! The files an interpreter reads and runs as it starts, seen from a fork server.
//!
//! A fork server starts its interpreter once and forks every execution of its key from it
//! (docs/warm-pool.md). Two things follow from that start being shared:
//!
//! - **Trust (strict mode).** A strict server runs as root, unconfined, so that each child can
//!   take its own uid and rules. What its interpreter runs at startup — `.pth` lines of its site
//!   dirs — therefore runs as root, where a cold strict start runs it confined, as the leased
//!   uid. A strict script may write beneath its write roots (the session cwd and
//!   `strict.write_roots`, through the file tools). If the interpreter, its prefix, a site dir
//!   or a dir a `.pth` file adds lies there (a project's own `.venv`, an editable install of the
//!   project, cwd `/`), a script could plant code that the *next* server would run as root:
//!   [`strict_server_refusal`] says so and such calls start cold, confined. (`sitecustomize`
//!   and `usercustomize` are not run by the server at all but by each child after its
//!   confinement, and `PYTHONPATH` is kept out of the strict server's startup, so neither
//!   needs this check.)
//! - **Freshness.** A server keeps what its interpreter found at startup. [`Fingerprint`] notes
//!   the interpreter the path resolved to and the modification times of its venv config and
//!   site dirs, so that a retargeted symlink, a recreated venv or a new `.pth` file
//!   (`pip install -e`) starts a new server instead of serving the old state.

use crate::confine::interpreter_paths;
use crate::launch::LaunchSpec;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Why a strict fork server must not start for `spec` (a path a strict script could write that
/// the server's startup would run code from), or `None` when it may.
pub(crate) fn strict_server_refusal(spec: &LaunchSpec) -> Option<String> {
    let roots: Vec<PathBuf> = std::iter::once(spec.session_cwd.clone())
        .chain(spec.strict.write_roots.iter().cloned())
        .map(|r| resolved(&r))
        .collect();
    let interpreter = &spec.interpreter.path;
    let (mut startup, sites) = installation(interpreter);
    if let Some(venv) = interpreter.parent().and_then(Path::parent) {
        if venv.join("pyvenv.cfg").is_file() {
            startup.push(venv.to_path_buf());
        }
    }
    for site in &sites {
        startup.extend(pth_path_lines(site));
    }
    startup.extend(sites);
    for name in ["PYTHONHOME", "PYTHONUSERBASE", "PYTHONPLATLIBDIR"] {
        if let Some((_, v)) = spec.base_env.iter().find(|(k, _)| k == name) {
            startup.push(PathBuf::from(v));
        }
    }
    for path in &startup {
        let at = resolved(path);
        for root in &roots {
            // Beneath a root, or a root beneath it (a write root inside the installation).
            if at.starts_with(root) || (at.is_dir() && root.starts_with(&at)) {
                return Some(format!(
                    "{} is read at the interpreter's startup and lies {} write root {}, where a \
                     strict script could plant code that a fork server would run as root; these \
                     calls start cold (confined). Use an interpreter outside the project (and \
                     its write roots) for warm strict calls",
                    path.display(),
                    if at.starts_with(root) {
                        "beneath"
                    } else {
                        "around"
                    },
                    root.display()
                ));
            }
        }
    }
    None
}

/// The interpreter with its prefixes and lib dirs (what strict mode grants it), and their site
/// dirs.
fn installation(interpreter: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut startup = interpreter_paths(interpreter);
    startup.push(interpreter.to_path_buf());
    let sites = site_dirs(&startup);
    (startup, sites)
}

/// The site dirs (`site-packages`, `dist-packages`) of the interpreter's prefixes and lib dirs
/// in `startup`.
fn site_dirs(startup: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut push = |d: PathBuf| {
        if d.is_dir() && !out.contains(&d) {
            out.push(d);
        }
    };
    for dir in startup.iter().filter(|d| d.is_dir()) {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref().is_some_and(|n| n.starts_with("python3")) {
            // A lib dir itself (`/usr/lib/python3.11`, `/usr/lib/python3`).
            push(dir.join("site-packages"));
            push(dir.join("dist-packages"));
            continue;
        }
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(dir.join(lib)) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with("python3") {
                    push(entry.path().join("site-packages"));
                    push(entry.path().join("dist-packages"));
                }
            }
        }
    }
    out
}

/// The dirs the `.pth` files of `site` add to `sys.path` (their lines that are not comments or
/// `import` lines, relative to `site`).
fn pth_path_lines(site: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "pth") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty()
                || line.starts_with('#')
                || line.starts_with("import ")
                || line.starts_with("import\t")
            {
                continue;
            }
            out.push(site.join(line));
        }
    }
    out
}

/// `path` with symlinks resolved as far as it exists (a dir a script could still create is
/// judged by where its existing ancestor really is).
fn resolved(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let mut rest = Vec::new();
    let mut at = path;
    while let Some(parent) = at.parent() {
        if let Some(name) = at.file_name() {
            rest.push(name.to_owned());
        }
        if let Ok(real) = std::fs::canonicalize(parent) {
            return rest.iter().rev().fold(real, |p, n| p.join(n));
        }
        at = parent;
    }
    path.to_path_buf()
}

/// What an interpreter's startup depended on when a server started: the file its path resolved
/// to and the modification times of that file, its venv config and its site dirs.
#[derive(Debug)]
pub(crate) struct Fingerprint {
    resolved: Option<PathBuf>,
    stamps: Vec<(PathBuf, Option<SystemTime>)>,
}

impl Fingerprint {
    /// The fingerprint of `interpreter` now.
    pub(crate) fn of(interpreter: &Path) -> Fingerprint {
        let resolved = crate::real_path::canonical(interpreter).ok();
        let mut watched: Vec<PathBuf> = resolved.iter().cloned().collect();
        if let Some(venv) = interpreter.parent().and_then(Path::parent) {
            watched.push(venv.join("pyvenv.cfg"));
        }
        watched.extend(installation(interpreter).1);
        let stamps = watched
            .into_iter()
            .map(|p| {
                let t = modified(&p);
                (p, t)
            })
            .collect();
        Fingerprint { resolved, stamps }
    }

    /// Whether `interpreter` still resolves to the same file and nothing watched changed.
    pub(crate) fn still_holds(&self, interpreter: &Path) -> bool {
        crate::real_path::canonical(interpreter).ok() == self.resolved
            && self.stamps.iter().all(|(p, t)| modified(p) == *t)
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
