//! Logs go to stderr and to `$VIBEOS_HOME/logs/agent.log`, at the level from `--log-level`,
//! else config `logging.level`, else `warn`. Values of environment variables are never logged.
//!
//! The file is written off the caller's thread (`tracing-appender`'s non-blocking writer: a
//! slow disk never stalls an execution) and rotated by size (`file-rotate`: past
//! [`LOG_FILE_BYTES`] the file becomes `agent.log.1`, older ones shift up, [`LOG_FILES_KEPT`]
//! are kept), so a long-lived server cannot fill the disk with its log.

use std::path::PathBuf;
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

/// Size past which `agent.log` is rotated.
pub const LOG_FILE_BYTES: usize = 10 << 20;
/// Lines the log file's writer thread may have queued before further lines are dropped.
pub const LOG_QUEUE_LINES: usize = 1024;
/// Rotated files kept besides `agent.log` (`agent.log.1` … `agent.log.5`).
pub const LOG_FILES_KEPT: usize = 5;

/// Keeps the log file's writer thread alive; dropping it flushes what is still queued. Hold it
/// until the process is done logging.
#[must_use = "dropping the guard stops writing the log file"]
pub struct LogGuard {
    _writer: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// Installs the global subscriber. Safe to call once per process; later calls are ignored.
pub fn init(level: &str) -> Result<LogGuard, LogLevelError> {
    let stderr_layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .with_filter(filter(level)?);
    let path = log_file();
    // Without a writable log directory the file log is left out (stderr still works); checked
    // here because the rotating writer cannot report it.
    let writable = path.parent().is_some_and(|dir| {
        std::fs::create_dir_all(dir).is_ok()
            && std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .is_ok()
    });
    let (file_layer, guard) = if writable {
        let rotating = file_rotate::FileRotate::new(
            &path,
            file_rotate::suffix::AppendCount::new(LOG_FILES_KEPT),
            file_rotate::ContentLimit::BytesSurpassed(LOG_FILE_BYTES),
            file_rotate::compression::Compression::None,
            None,
        );
        // The default queue (128,000 lines) is a 4 MB array written in full when it is made:
        // about a fifth of the supervisor's CPU on a cold no-op `run`. The log holds warnings and
        // errors; a thousand queued lines is ample, and a flood past them is dropped (lossy,
        // as by default) rather than stalling an execution.
        let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
            .buffered_lines_limit(LOG_QUEUE_LINES)
            .finish(rotating);
        let layer = fmt::layer()
            .with_writer(writer)
            .with_ansi(false)
            .with_filter(filter(level).unwrap_or_else(|_| EnvFilter::new("warn")));
        (Some(layer), Some(guard))
    } else {
        (None, None)
    };
    let _ = tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init();
    Ok(LogGuard { _writer: guard })
}
