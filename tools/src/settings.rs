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

use crate::config_file::{read_text, ConfigFile, ConfigFileError};
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

/// What identifies one version of the file on disk: size, mtime, inode, and whether it is a
/// regular file; `None` when it does not exist.
type Stamp = Option<(u64, std::time::SystemTime, u64, bool)>;

fn stamp_of(m: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Some((
        m.len(),
        m.modified().unwrap_or(std::time::UNIX_EPOCH),
        m.ino(),
        m.is_file(),
    ))
}

fn stamp(path: &Path) -> Result<Stamp, ConfigFileError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(stamp_of(&m)),
        // A link made dangling after an absent file was cached must not match that cache.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::config_file::absent_or_dangling(path).map(|()| None)
        }
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

/// Config files that are not regular files (`--config <(...)`, a FIFO), by path and inode,
/// with their parse. What a pipe held can be read once: a second read finds it drained and
/// would see an empty file, so every later load of the same pipe uses this parse.
static STREAMS: Mutex<Vec<(PathBuf, u64, Arc<ConfigFile>)>> = Mutex::new(Vec::new());

/// The parsed file at `path` (the defaults when it does not exist and `required` is false),
/// from the cache when the file has not changed since it was parsed.
pub fn load_at(path: &Path, required: bool) -> Result<Arc<ConfigFile>, ConfigFileError> {
    let before = stamp(path)?;
    if let Some((_, _, ino, false)) = before {
        let streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, file)) = streams.iter().find(|(p, i, _)| p == path && *i == ino) {
            return Ok(file.clone());
        }
    }
    if let Ok(guard) = CACHE.lock() {
        if let Some(c) = guard.as_ref() {
            if c.path == path && c.stamp == before && (before.is_some() || !required) {
                // File timestamps tick coarsely (milliseconds): two writes of the same size
                // within one tick look alike, so a file changed in the last seconds is
                // compared by content before the cached parse is trusted.
                let settled = before.is_none_or(|(_, mtime, _, _)| {
                    mtime
                        .elapsed()
                        .is_ok_and(|age| age > std::time::Duration::from_secs(2))
                });
                if settled
                    || read_text(path)
                        .ok()
                        .flatten()
                        .is_some_and(|now| now.text.as_bytes() == c.text.as_slice())
                {
                    return Ok(c.file.clone());
                }
            }
        }
    }
    // One read: the text parsed is the text cached, and its stamp is that of the file it was
    // read from.
    let Some(read) = read_text(path)? else {
        if required {
            return Err(ConfigFileError::Unreadable {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "No such file or directory (named by --config or $VIBEOS_CONFIG)",
                ),
            });
        }
        let file = Arc::new(ConfigFile::default());
        remember(path, None, Vec::new(), &file);
        return Ok(file);
    };
    let file = Arc::new(ConfigFile::parse(&read.text, path)?);
    let read_stamp = stamp_of(&read.metadata);
    if let Some((_, _, ino, false)) = read_stamp {
        let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|(p, _, _)| p != path);
        streams.push((path.to_path_buf(), ino, file.clone()));
        return Ok(file);
    }
    remember(path, read_stamp, read.text.into_bytes(), &file);
    Ok(file)
}

/// Caches the parse of a regular file (or of its absence) under the stamp of what was read.
fn remember(path: &Path, stamp: Stamp, text: Vec<u8>, file: &Arc<ConfigFile>) {
    if let Ok(mut guard) = CACHE.lock() {
        *guard = Some(Cached {
            path: path.to_path_buf(),
            stamp,
            text,
            file: file.clone(),
        });
    }
}

/// The last parse that succeeded and the path it was read from, for readers that go on while
/// that file is broken ([`current_or_last_good`]).
static LAST_GOOD: Mutex<Option<(PathBuf, Arc<ConfigFile>)>> = Mutex::new(None);

/// The parsed config file in use ([`config_path`]). A missing default file is the defaults; a
/// file that does not parse is an error naming the file and the key.
pub fn current() -> Result<Arc<ConfigFile>, ConfigFileError> {
    let (path, required) = resolve_config_path(None);
    let file = load_at(&path, required)?;
    let mut last = LAST_GOOD.lock().unwrap_or_else(|p| p.into_inner());
    if !last
        .as_ref()
        .is_some_and(|(p, f)| *p == path && Arc::ptr_eq(f, &file))
    {
        *last = Some((path, file.clone()));
    }
    Ok(file)
}

/// [`current`], or, when the file no longer parses (an edit made while a long-lived host runs;
/// hosts refuse to start on a broken file), the settings last read from the same path, with
/// the error logged. An error only when the file has never parsed in this process: the
/// defaults are not what the operator wrote (a deny rule among them would be lost), so each
/// reader decides what is safe without it.
pub fn current_or_last_good() -> Result<Arc<ConfigFile>, ConfigFileError> {
    current().or_else(|e| {
        let path = config_path();
        let last = LAST_GOOD.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref().filter(|(p, _)| *p == path) {
            Some((_, file)) => {
                tracing::warn!("{e}; keeping the settings last read from it until it is fixed");
                Ok(file.clone())
            }
            None => Err(e),
        }
    })
}

/// [`current_or_last_good`] for readers whose defaults are the safe side (redaction on, no
/// allowlist, web tools unconfigured): a file that never parsed gives the defaults, logged.
pub fn current_or_default() -> Arc<ConfigFile> {
    current_or_last_good().unwrap_or_else(|e| {
        tracing::warn!("{e}; using the defaults");
        Arc::new(ConfigFile::default())
    })
}

/// Whether `security.redact_output` is on (the default; only an explicit `false` turns it off).
/// Here, below both, for [`crate::redact`] and the output capture, which drops what a cut
/// split only when redaction will run.
pub fn redact_output() -> bool {
    current_or_default()
        .security
        .as_ref()
        .and_then(|s| s.redact_output)
        != Some(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn timeout_of(file: &ConfigFile) -> Option<f64> {
        file.code_execution.as_ref().and_then(|c| c.timeout)
    }

    #[test]
    fn a_config_from_a_pipe_is_read_once_and_its_parse_kept() {
        // `--config <(...)`: the path names a pipe whose text can be read once.
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer
            .write_all(b"code_execution:\n  timeout: 7\n")
            .unwrap();
        drop(writer);
        let path = PathBuf::from(format!("/proc/self/fd/{}", reader.as_raw_fd()));
        let first = load_at(&path, true).unwrap();
        assert_eq!(timeout_of(&first), Some(7.0));
        // A second read would find the pipe drained and see an empty file (the defaults).
        let again = load_at(&path, true).unwrap();
        assert_eq!(timeout_of(&again), Some(7.0));
        drop(reader);
    }

    #[test]
    fn a_config_that_never_ends_is_refused_by_the_cap() {
        let e = load_at(Path::new("/dev/zero"), true).unwrap_err();
        assert!(matches!(e, ConfigFileError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn a_dangling_link_at_the_default_path_is_an_error_even_after_an_absent_file() {
        // The default path may be absent (the defaults), but a link to nothing there is a
        // config the operator meant: an error, also when the absence was cached just before.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        assert!(load_at(&path, false).unwrap().code_execution.is_none());
        std::os::unix::fs::symlink("/nonexistent", &path).unwrap();
        let e = load_at(&path, false).unwrap_err();
        assert!(matches!(e, ConfigFileError::DanglingLink { .. }), "{e}");
        assert!(
            e.to_string().contains("symbolic link to /nonexistent"),
            "{e}"
        );
    }

    #[test]
    fn the_text_cached_is_the_text_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "code_execution:\n  timeout: 3\n").unwrap();
        assert_eq!(timeout_of(&load_at(&path, true).unwrap()), Some(3.0));
        // Same size, written within the same second: told apart by content.
        std::fs::write(&path, "code_execution:\n  timeout: 4\n").unwrap();
        assert_eq!(timeout_of(&load_at(&path, true).unwrap()), Some(4.0));
        let cached = CACHE.lock().unwrap();
        let c = cached.as_ref().unwrap();
        if c.path == path {
            assert_eq!(c.text, b"code_execution:\n  timeout: 4\n");
        }
    }
}
