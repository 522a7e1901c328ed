//! Why an execution could not start ([`StartError`]).
//!
//! A leaf module: every stage of a start (request, launch, pool, fork server, remote, execute)
//! returns this error, so it sits below all of them.

use crate::confine::ConfineError;
use std::path::PathBuf;

/// Why an execution could not start. Its message becomes the result's `error`.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Nothing to run.
    #[error("the script is empty; pass Python code that prints its result")]
    EmptyCode,
    /// Strict confinement is not available.
    #[error("{0}")]
    StrictUnavailable(String),
    /// Strict confinement could not be prepared (missing kernel feature, bad policy, ...).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// The session working dir is unusable.
    #[error("working directory {path} is not usable: {reason}")]
    BadCwd {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No interpreter.
    #[error(transparent)]
    Interpreter(#[from] crate::interpreter::InterpreterError),
    /// The environment policy is broken.
    #[error(transparent)]
    Policy(#[from] crate::env_policy::PolicyError),
    /// The staging dir could not be prepared.
    #[error("cannot prepare the staging directory: {0}; check that TMPDIR is writable")]
    Staging(std::io::Error),
    /// The socket path would be too long.
    #[error("the RPC socket path {0} is longer than Unix sockets allow; set TMPDIR to a shorter directory")]
    SocketPathTooLong(PathBuf),
    /// The staging dir's path holds a `:`, which `PYTHONPATH` cannot carry: its halves would
    /// become two other entries, one of them relative to the script's cwd (a place someone
    /// else may control).
    #[error("the staging directory {0} holds a ':', which PYTHONPATH cannot carry; set TMPDIR to a directory without one")]
    StagingPathHasColon(PathBuf),
    /// The RPC listener could not be opened.
    #[error("cannot open the RPC socket: {0}")]
    Listener(std::io::Error),
    /// The interpreter could not be started.
    #[error("cannot start {interpreter}: {source}")]
    Spawn {
        /// The interpreter.
        interpreter: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}
