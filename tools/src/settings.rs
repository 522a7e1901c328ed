//! Where `config.yaml` is, and the parsed file every part of the product reads.
//!
//! The tools crate knows nothing of the supervisor (ARCHITECTURE: one direction, no
//! back-references), yet approval (`command_allowlist`), the web backends (`web:`) and the
//! terminal backends are configured in the same file the supervisor reads. So the one resolver
//! of the config path lives here — the pinned path ([`set_config_path`], the CLI's `--config`),
//! else `$VIBEOS_CONFIG`, else `$VIBEOS_HOME/config.yaml`, else `~/.vibeos/config.yaml` — and the
//! supervisor asks it too.
//!
//! The parsed file is cached per path and re-read only when the file changes (size, mtime or
//! inode differ): one `run` parses it once, yet an "always" approval written by one call (an
//! atomic rename, so a new inode) is seen by the next.

use crate::config_file::{ConfigFile, ConfigFileError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

static CONFIG_OVERRIDE: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Pins the config file the tools read and write (`None` restores the default lookup).
pub fn set_config_path(path: Option<PathBuf>) {
    if let Ok(mut guard) = CONFIG_OVERRIDE.write() {
        *guard = path;
    }
}

/// The config file in use: the pinned path, else `$VIBEOS_CONFIG`, else
/// `$VIBEOS_HOME/config.yaml`, else `~/.vibeos/config.yaml`.
pub fn config_path() -> PathBuf {
    resolve_config_path(None).0
}

/// The one resolver of the config path. An `explicit` path (a `--config` flag) wins, then the
/// pinned path, `$VIBEOS_CONFIG`, `$VIBEOS_HOME/config.yaml` and `~/.vibeos/config.yaml`. The
/// flag says whether the file must exist: a path somebody named must, the default one may be
/// absent (then the defaults apply), and so may a pinned one.
pub fn resolve_config_path(explicit: Option<&Path>) -> (PathBuf, bool) {
    if let Some(p) = explicit {
        return (p.to_path_buf(), true);
    }
    // A pinned path may not exist yet: "always" approvals create it.
    if let Some(p) = CONFIG_OVERRIDE.read().ok().and_then(|g| g.clone()) {
        return (p, false);
    }
    if let Some(p) = std::env::var_os("VIBEOS_CONFIG").filter(|p| !p.is_empty()) {
        return (PathBuf::from(p), true);
    }
    (vibeos_home().join("config.yaml"), false)
}

/// The vibeos home dir: `$VIBEOS_HOME`, else `~/.vibeos`.
pub fn vibeos_home() -> PathBuf {
    if let Some(h) = std::env::var_os("VIBEOS_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".vibeos")
}

/// What identifies one version of the file on disk; `None` when it does not exist.
type Stamp = Option<(u64, std::time::SystemTime, u64)>;

fn stamp(path: &Path) -> Result<Stamp, ConfigFileError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some((
            m.len(),
            m.modified().unwrap_or(std::time::UNIX_EPOCH),
            m.ino(),
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigFileError::Unreadable {
            path: path.to_path_buf(),
            source,
        }),
    }
}

struct Cached {
    path: PathBuf,
    stamp: Stamp,
    /// The bytes that were parsed, to tell a recent same-size rewrite from no change.
    text: Vec<u8>,
    file: Arc<ConfigFile>,
}

static CACHE: Mutex<Option<Cached>> = Mutex::new(None);

/// The parsed file at `path` (the defaults when it does not exist and `required` is false),
/// from the cache when the file has not changed since it was parsed.
pub fn load_at(path: &Path, required: bool) -> Result<Arc<ConfigFile>, ConfigFileError> {
    let before = stamp(path)?;
    if let Ok(guard) = CACHE.lock() {
        if let Some(c) = guard.as_ref() {
            if c.path == path && c.stamp == before && (before.is_some() || !required) {
                // File timestamps tick coarsely (milliseconds): two writes of the same size
                // within one tick look alike, so a file changed in the last seconds is
                // compared by content before the cached parse is trusted.
                let settled = before.is_none_or(|(_, mtime, _)| {
                    mtime
                        .elapsed()
                        .is_ok_and(|age| age > std::time::Duration::from_secs(2))
                });
                if settled || std::fs::read(path).ok().as_deref() == Some(c.text.as_slice()) {
                    return Ok(c.file.clone());
                }
            }
        }
    }
    let text = std::fs::read(path).unwrap_or_default();
    let file = match ConfigFile::read(path)? {
        Some(f) => Arc::new(f),
        None if required => {
            return Err(ConfigFileError::Unreadable {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "No such file or directory (named by --config or $VIBEOS_CONFIG)",
                ),
            })
        }
        None => Arc::new(ConfigFile::default()),
    };
    // Cache under the stamp taken before reading: if the file changed in between, the next
    // call sees a different stamp and reads it again.
    if let Ok(mut guard) = CACHE.lock() {
        *guard = Some(Cached {
            path: path.to_path_buf(),
            stamp: before,
            text,
            file: file.clone(),
        });
    }
    Ok(file)
}

/// The parsed config file in use ([`config_path`]). A missing default file is the defaults; a
/// file that does not parse is an error naming the file and the key.
pub fn current() -> Result<Arc<ConfigFile>, ConfigFileError> {
    let (path, required) = resolve_config_path(None);
    load_at(&path, required)
}

/// [`current`] for readers that must go on with safe defaults when the file is broken (the
/// host already refused to start on it; this covers an edit made while it runs): the error is
/// logged and the defaults are used.
pub fn current_or_default() -> Arc<ConfigFile> {
    current().unwrap_or_else(|e| {
        tracing::warn!("{e}; using the defaults");
        Arc::new(ConfigFile::default())
    })
}
