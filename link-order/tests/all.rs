//! Integration tests of the `vibeos-link-order` binary (one test binary per crate).

mod suite;
