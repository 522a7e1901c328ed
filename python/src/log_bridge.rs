//! Rust log records forwarded to Python's `logging` (logger `vibeos_exec`, child loggers by
//! module: `vibeos_exec.vibeos_tools.approval`, …).
//!
//! A Python host configures logging once, the Python way; records of the supervisor and the
//! tools (a skipped MCP server, a refused registration, a denied command, a shim resolution)
//! must arrive there rather than vanish (no subscriber) or bypass its handlers on stderr.
//! Records below the level of `logging.level` in config.yaml (default `info`) are not
//! forwarded, so a debug record never costs a GIL round trip; Python's own logger levels filter
//! the rest. Messages carry names, never values, of environment variables (the supervisor's
//! rule), so forwarding them adds no leak.

use pyo3::prelude::*;
use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

struct PythonLogging;

#[derive(Default)]
struct Message {
    text: String,
    fields: String,
}

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.text.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

fn python_level(level: &Level) -> u32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

impl<S: Subscriber> Layer<S> for PythonLogging {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut msg = Message::default();
        event.record(&mut msg);
        let mut text = format!("{}{}", msg.text, msg.fields);
        // Credentials in URLs (an MCP server's `url:`, quoted by the HTTP client's and the MCP
        // SDK's errors) are masked here as in the CLI's log (`url_mask`): a host's logging
        // handlers write wherever it likes.
        if text.contains("://") {
            text = vibeos_tools::url_mask::mask_urls_in(&text);
        }
        let logger = format!("vibeos_exec.{}", meta.target().replace("::", "."));
        let level = python_level(meta.level());
        // The interpreter may be finalizing (records from exit-time cleanup): then the
        // record is dropped (`with_python` does not enter).
        let _ = crate::with_python(|py| {
            let sent = py
                .import("logging")
                .and_then(|logging| logging.call_method1("getLogger", (logger,)))
                .and_then(|l| l.call_method1("log", (level, text)));
            if let Err(e) = sent {
                // A broken handler must not break the call that logged.
                e.print(py);
            }
        });
    }
}

/// Installs the bridge as the process's tracing subscriber, at `level` (config
/// `logging.level`, default info). Does nothing if the host already installed one.
pub fn install(level: Option<&str>) {
    let filter = match level.map(|l| l.trim().to_ascii_lowercase()).as_deref() {
        Some("error") => LevelFilter::ERROR,
        Some("warn" | "warning") => LevelFilter::WARN,
        Some("debug") => LevelFilter::DEBUG,
        Some("trace") => LevelFilter::TRACE,
        Some("off") => LevelFilter::OFF,
        _ => LevelFilter::INFO,
    };
    let _ = tracing_subscriber::registry()
        .with(PythonLogging.with_filter(filter))
        .try_init();
}
