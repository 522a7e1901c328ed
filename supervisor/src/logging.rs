//! Logs go to stderr and to `$VIBEOS_HOME/logs/agent.log`, at the level from `--log-level`,
//! else config `logging.level`, else `warn`. Values of environment variables are never logged.

use std::path::PathBuf;
use std::sync::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// The log level could not be understood.
#[derive(Debug, thiserror::Error)]
#[error("invalid log level {level:?}: use error, warn, info, debug or trace ({reason})")]
pub struct LogLevelError {
    /// What was given.
    pub level: String,
    /// What the parser said.
    pub reason: String,
}

fn filter(level: &str) -> Result<EnvFilter, LogLevelError> {
    let level = level.trim();
    let ok = matches!(
        level.to_ascii_lowercase().as_str(),
        "error" | "warn" | "warning" | "info" | "debug" | "trace" | "off"
    );
    if !ok && !level.contains('=') {
        return Err(LogLevelError {
            level: level.into(),
            reason: "not a level name".into(),
        });
    }
    let level = if level.eq_ignore_ascii_case("warning") {
        "warn"
    } else {
        level
    };
    EnvFilter::try_new(level).map_err(|e| LogLevelError {
        level: level.into(),
        reason: e.to_string(),
    })
}

/// Checks a level without installing anything.
pub fn validate_level(level: &str) -> Result<(), LogLevelError> {
    filter(level).map(|_| ())
}

/// The log file path.
pub fn log_file() -> PathBuf {
    crate::config::vibeos_home().join("logs").join("agent.log")
}

/// Installs the global subscriber. Safe to call once per process; later calls are ignored.
pub fn init(level: &str) -> Result<(), LogLevelError> {
    let stderr_layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .with_filter(filter(level)?);
    let path = log_file();
    let file = path
        .parent()
        .map(std::fs::create_dir_all)
        .transpose()
        .ok()
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .ok()
        });
    let file_layer = file.map(|f| {
        fmt::layer()
            .with_writer(Mutex::new(f))
            .with_ansi(false)
            .with_filter(filter(level).unwrap_or_else(|_| EnvFilter::new("warn")))
    });
    let _ = tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init();
    Ok(())
}
