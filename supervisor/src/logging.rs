//! Logs go to stderr and to `$VIBEOS_HOME/logs/agent.log`, at the level from `--log-level`,
//! else config `logging.level`, else `warn`. Values of environment variables are never logged.
//!
//! The file is written off the caller's thread (`tracing-appender`'s non-blocking writer: a
//! slow disk never stalls an execution), which starts with the first line for the file, and
//! rotated by size (`file-rotate`: past
//! [`LOG_FILE_BYTES`] the file becomes `agent.log.1`, older ones shift up, [`LOG_FILES_KEPT`]
//! are kept), so a long-lived server cannot fill the disk with its log.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::fmt::writer::{MakeWriter, OptionalWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// The log level could not be understood.
#[derive(Debug, thiserror::Error)]
#[error("invalid log level {level:?}: use error, warn, info, debug, trace or off, or a filter such as vibeos_tools=debug ({reason})")]
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
    // html5ever (web_extract's HTML parser) warns about every page it repairs ("foster
    // parenting not implemented"): noise for the user at the quiet levels, kept at debug/trace.
    let quiet = ["error", "warn", "info"].contains(&level.to_ascii_lowercase().as_str());
    // The HTTP client's own debug lines quote its connection pool's keys, user and password of
    // a URL included (a redirect to `http://eve:secret@host/` reached agent.log, stop 60's
    // probe): at the level names they stay at info. A filter naming them (`hyper_util=debug`)
    // still gets them.
    let level = if quiet {
        format!("{level},html5ever=error,markup5ever=error")
    } else if ok {
        format!("{level},hyper=info,hyper_util=info,reqwest=info,h2=info")
    } else {
        level.to_string()
    };
    let level = level.as_str();
    EnvFilter::try_new(level).map_err(|e| LogLevelError {
        level: level.into(),
        reason: filter_problem(&e),
    })
}

/// What is wrong with a filter, in the terms the level is documented with. tracing's own words
/// for a bad level offer "or a number 0-5", which `--log-level 5` and `logging.level` do not
/// take: the levels are names.
fn filter_problem(e: &tracing_subscriber::filter::ParseError) -> String {
    use std::error::Error;
    if e.source()
        .is_some_and(|s| s.is::<tracing::level_filters::ParseLevelFilterError>())
    {
        "a filter's level must be error, warn, info, debug, trace or off".into()
    } else {
        e.to_string()
    }
}

/// Checks a level without installing anything.
pub fn validate_level(level: &str) -> Result<(), LogLevelError> {
    filter(level).map(|_| ())
}

/// The log file path.
pub fn log_file() -> PathBuf {
    // The tools crate's resolver (what `config::vibeos_home` asks), named directly so that
    // the config can check `logging.level` with this module without a cycle.
    vibeos_tools::settings::vibeos_home()
        .join("logs")
        .join("agent.log")
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
    file: Arc<LazyFile>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        // The worker's guard flushes the queue and joins its thread when dropped.
        let guard = self.file.guard.lock().map(|mut g| g.take()).unwrap_or(None);
        drop(guard);
    }
}

/// The log file's writer, started by the first line that reaches the file: a run that logs
/// nothing at the file's level (a cold no-op `run`) starts no writer thread, opens no file
/// and has no thread to wait for at exit, a few hundred microseconds of its wall time.
struct LazyFile {
    path: PathBuf,
    writer: OnceLock<Option<NonBlocking>>,
    guard: Mutex<Option<WorkerGuard>>,
}

impl LazyFile {
    /// The writer, started on first use; `None` without a writable log directory (the file log
    /// is then left out, stderr still works; checked here because the rotating writer cannot
    /// report it).
    fn writer(&self) -> Option<&NonBlocking> {
        self.writer
            .get_or_init(|| {
                let dir = self.path.parent()?;
                std::fs::create_dir_all(dir).ok()?;
                // Without blocking, and only a regular file: a FIFO there held the process in
                // open(2) for ever, deaf to SIGTERM and SIGINT (their handlers log).
                use std::os::unix::fs::OpenOptionsExt;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&self.path);
                if !file.is_ok_and(|f| f.metadata().is_ok_and(|m| m.is_file())) {
                    eprintln!(
                        "vibeos-exec: not logging to {}: it cannot be opened as a regular file \
                         (logs go to stderr only)",
                        self.path.display()
                    );
                    return None;
                }
                let rotating = file_rotate::FileRotate::new(
                    &self.path,
                    file_rotate::suffix::AppendCount::new(LOG_FILES_KEPT),
                    file_rotate::ContentLimit::BytesSurpassed(LOG_FILE_BYTES),
                    file_rotate::compression::Compression::None,
                    None,
                );
                // The default queue (128,000 lines) is a 4 MB array written in full when it is
                // made: about a fifth of the supervisor's CPU on a cold no-op `run`. The log
                // holds warnings and errors; a thousand queued lines is ample, and a flood past
                // them is dropped (lossy, as by default) rather than stalling an execution.
                let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                    .buffered_lines_limit(LOG_QUEUE_LINES)
                    .finish(rotating);
                if let Ok(mut slot) = self.guard.lock() {
                    *slot = Some(guard);
                }
                Some(writer)
            })
            .as_ref()
    }
}

/// [`LazyFile`] as the file layer's writer.
#[derive(Clone)]
struct LazyFileWriter(Arc<LazyFile>);

impl<'a> MakeWriter<'a> for LazyFileWriter {
    type Writer = MaskUrls<OptionalWriter<NonBlocking>>;

    fn make_writer(&'a self) -> Self::Writer {
        MaskUrls(self.0.writer().cloned().into())
    }
}

/// A log writer that masks credentials in the URLs of what it writes
/// ([`vibeos_tools::url_mask`]): a configured MCP server URL may hold a password or a key, and
/// messages quote it, ours and those of the HTTP client and the MCP SDK alike. Each event is
/// one write of its formatted line, so a URL is never split across writes.
struct MaskUrls<W>(W);

impl<W: std::io::Write> std::io::Write for MaskUrls<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !buf.windows(3).any(|w| w == b"://") {
            return self.0.write(buf);
        }
        let masked = vibeos_tools::url_mask::mask_urls_in(&String::from_utf8_lossy(buf));
        self.0.write_all(masked.as_bytes())?;
        // All of `buf` was taken, in its masked form.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Installs the global subscriber. Safe to call once per process; later calls are ignored.
pub fn init(level: &str) -> Result<LogGuard, LogLevelError> {
    let stderr_layer = fmt::layer()
        .with_writer(|| MaskUrls(std::io::stderr()))
        .with_target(false)
        .with_ansi(false)
        .with_filter(filter(level)?);
    let file = Arc::new(LazyFile {
        path: log_file(),
        writer: OnceLock::new(),
        guard: Mutex::new(None),
    });
    let file_layer = fmt::layer()
        .with_writer(LazyFileWriter(Arc::clone(&file)))
        .with_ansi(false)
        .with_filter(filter(level).unwrap_or_else(|_| EnvFilter::new("warn")));
    let _ = tracing_subscriber::registry()
        .with(stderr_layer)
        .with(file_layer)
        .try_init();
    Ok(LogGuard { file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_errors_offer_only_what_is_accepted() {
        // tracing's message for a filter's bad level offered "or a number 0-5", and the level
        // itself (`5`) was refused: the messages name the level names, which are accepted.
        for bad in ["5", "0", "bogus", "vibeos_tools=bogus", "a=b=c"] {
            let e = validate_level(bad).unwrap_err().to_string();
            assert!(!e.contains("number"), "{bad}: {e}");
            assert!(
                e.contains("use error, warn, info, debug, trace or off"),
                "{bad}: {e}"
            );
        }
        let e = validate_level("vibeos_tools=bogus").unwrap_err();
        assert_eq!(
            e.reason,
            "a filter's level must be error, warn, info, debug, trace or off"
        );
        for good in ["error", "WARN", "warning", "info", "debug", "trace", "off"] {
            assert!(validate_level(good).is_ok(), "{good}");
        }
        assert!(validate_level("vibeos_tools=debug,warn").is_ok());
    }

    #[test]
    fn the_http_client_s_own_lines_stay_out_of_debug_and_trace() {
        // Its debug lines quote pool keys with a URL's user and password.
        for level in ["debug", "trace", "TRACE"] {
            let shown = filter(level).unwrap().to_string();
            assert!(shown.contains("hyper_util=info"), "{level}: {shown}");
            assert!(shown.contains("reqwest=info"), "{level}: {shown}");
        }
        // Named in a filter, they are the user's choice.
        let shown = filter("hyper_util=trace").unwrap().to_string();
        assert!(!shown.contains("hyper_util=info"), "{shown}");
    }
}
