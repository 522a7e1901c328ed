//! Terminal backends: where `terminal` commands run (SPEC §9).
//!
//! Only the `local` backend exists so far; remote backends (docker, ssh, …) would implement the
//! same operations — run a command in the foreground with a timeout and an output cap, start a
//! background process, poll, write to and kill it.

pub mod local;

pub use crate::capture::HeadTail;
