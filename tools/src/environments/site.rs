//! Where an environment runs commands and scripts on its side: the working dir and the
//! interpreter. Every backend has both and nothing more to say about them, so they are one
//! struct that each backend embeds and [`super::Environment`]'s `workdir` and `python` read,
//! instead of the same two fields and accessors in every backend.

/// An environment's working dir and interpreter, on that side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    /// The working dir commands and tools start in (`terminal.cwd`, else the backend's default).
    pub workdir: String,
    /// The interpreter (`terminal.python`).
    pub python: String,
}
