//! The end-to-end suite of `vibeos-exec`: real Python children, real sockets, real daemons where
//! they run here. One integration-test binary for the whole package (one link instead of one per
//! file); the modules under `suite/` are the areas.
//!
//! These tests live in the package that builds the binary, so `cargo test -p vibeos-cli`
//! always rebuilds what it runs: the helpers of `vibeos-testkit` run
//! `CARGO_BIN_EXE_vibeos-exec`, never a possibly stale `target/debug/vibeos-exec`.

/// The binary cargo built for this package's tests; every helper must run this one.
#[test]
fn the_suite_runs_the_binary_this_package_built() {
    assert_eq!(
        vibeos_testkit::exec_bin(),
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec")),
        "the test helpers would run another vibeos-exec than the one cargo just built"
    );
}

mod suite;
