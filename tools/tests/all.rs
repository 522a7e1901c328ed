//! Integration tests of the tool registry and the built-in tools, through the crate's public
//! API: one test binary for the crate (one link instead of one per file); the modules under
//! `suite/` are the areas.

mod suite;
