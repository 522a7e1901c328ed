//! Integration tests of the supervisor library (`execute`, the warm pool, the execute_code
//! registry entry) through its public API: one test binary for the crate; the modules under
//! `suite/` are the areas.

mod suite;
