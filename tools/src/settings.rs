//! Where the tools find `config.yaml`, and reading its sections.
//!
//! The tools crate knows nothing of the supervisor (ARCHITECTURE: one direction, no
//! back-references), yet approval (`command_allowlist`) and the web backends (`web:`) are
//! configured in the same file the supervisor reads. So this module locates it the same way —
//! `$VIBEOS_CONFIG`, else `$VIBEOS_HOME/config.yaml`, else `~/.vibeos/config.yaml` — and an
//! embedder (or the CLI's `--config`) can pin it with [`set_config_path`]. The file is re-read on
//! each use: it is small, and an "always" approval written by one call must be seen by the next.

use serde_yaml_ng::Value;
use std::path::PathBuf;
use std::sync::RwLock;

static CONFIG_OVERRIDE: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Pins the config file the tools read and write (`None` restores the default lookup).
pub fn set_config_path(path: Option<PathBuf>) {
    if let Ok(mut guard) = CONFIG_OVERRIDE.write() {
        *guard = path;
    }
}

/// The config file the tools use: the pinned path, else `$VIBEOS_CONFIG`, else
/// `$VIBEOS_HOME/config.yaml`, else `~/.vibeos/config.yaml`.
pub fn config_path() -> PathBuf {
    if let Some(p) = CONFIG_OVERRIDE.read().ok().and_then(|g| g.clone()) {
        return p;
    }
    if let Some(p) = std::env::var_os("VIBEOS_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(h) = std::env::var_os("VIBEOS_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join("config.yaml");
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".vibeos").join("config.yaml")
}

/// The parsed config document; `Null` when the file is missing. A file that exists but does
/// not parse is an error naming the file, so a typo never silently disables a setting.
pub fn load_document() -> Result<Value, String> {
    let path = config_path();
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => Ok(Value::Null),
        Ok(text) => serde_yaml_ng::from_str(&text)
            .map_err(|e| format!("config file {} is not valid YAML: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Null),
        Err(e) => Err(format!("cannot read config file {}: {e}", path.display())),
    }
}

/// A top-level section of the config document (`Null` when absent or unreadable).
pub fn section(name: &str) -> Value {
    load_document()
        .ok()
        .and_then(|doc| doc.get(name).cloned())
        .unwrap_or(Value::Null)
}
