//! Helpers every integration-test binary of the workspace shares.
//!
//! Why it exists: the end-to-end helpers ([`Sandbox`], [`exec_bin`], [`strict_unavailable`], the
//! real daemons of [`backends`]) are used by the CLI's suite, the supervisor's tests and the
//! benchmarks alike, so they live here once instead of being copied. And libtest has no runtime skip. A test that returns early because something it
//! needs is missing (a Python with the MCP SDK, strict-mode support, a daemon) is reported as
//! *passed*, which overstates what was checked. [`skip!`] makes such a test say why on stderr and
//! append one record to the file named by `VIBEOS_TEST_SKIPS`; `scripts/test-all` counts those
//! records as skipped (and no longer as passed) in its closing total and lists their reasons.
//!
//! On CI (`CI=true`) the machine is expected to have everything the suite can install, so a skip
//! there is a failure: [`skip!`] panics with the reason. Only what can never exist on these
//! machines may skip on CI, through [`skip_even_in_ci!`].

pub mod backends;
pub mod daytona;
mod e2e;
pub mod modal;

pub use e2e::*;

use std::fmt::Display;
use std::io::Write;

/// Variables a test set in its own process's environment (a stand-in's credentials, which
/// the supervisor under test reads from there), removed again when this is dropped, so that no
/// later test of the same binary inherits an endpoint that no longer exists.
#[must_use = "the variables are removed when this is dropped"]
pub struct ExportedEnv(Vec<&'static str>);

/// Sets `vars` in this process's environment until the returned guard is dropped.
pub fn export_env(vars: Vec<(&'static str, String)>) -> ExportedEnv {
    let names = vars.iter().map(|(k, _)| *k).collect();
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    ExportedEnv(names)
}

impl Drop for ExportedEnv {
    fn drop(&mut self) {
        for k in &self.0 {
            std::env::remove_var(k);
        }
    }
}

/// Environment variable naming the file skip records are appended to.
pub const SKIP_LOG_ENV: &str = "VIBEOS_TEST_SKIPS";

/// Whether this run is CI's (`CI=true`), where missing prerequisites are failures.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Name of the running test, as libtest names its thread (`module::test_name`).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string()
}

/// Records that the running test is skipped, and why. Prefer the [`skip!`] macro, which also
/// returns from the test and fails on CI.
pub fn record_skip(reason: &dyn Display) {
    let test = current_test();
    let reason = reason.to_string().replace(['\n', '\t'], " ");
    eprintln!("SKIP: {test}: {reason}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    // One short O_APPEND write per record: concurrent tests and test binaries cannot interleave.
    let line = format!("{test}\t{reason}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("SKIP record not written to {}: {e}", path.to_string_lossy());
    }
}

/// Fails the running test with `reason` on CI; elsewhere records the skip. Prefer [`skip!`].
pub fn skip_or_fail_in_ci(reason: &dyn Display) {
    if in_ci() {
        panic!("{reason} (CI=true: this prerequisite must be present, so the test fails instead of skipping)");
    }
    record_skip(reason);
}

/// Skips the running test with a reason: records it (see the crate docs) and returns from the
/// enclosing function. On CI it panics instead. Use in a `#[test]` fn (or a fn returning `()`,
/// or with a value to return: `skip!(value; "why {x}")`).
#[macro_export]
macro_rules! skip {
    ($ret:expr; $($fmt:tt)+) => {{
        $crate::skip_or_fail_in_ci(&format_args!($($fmt)+));
        return $ret;
    }};
    ($($fmt:tt)+) => {{
        $crate::skip_or_fail_in_ci(&format_args!($($fmt)+));
        return;
    }};
}

/// Like [`skip!`], but skips on CI too: only for prerequisites that cannot exist on the
/// project's machines (say, a binary no registry they reach packages).
#[macro_export]
macro_rules! skip_even_in_ci {
    ($($fmt:tt)+) => {{
        $crate::record_skip(&format_args!($($fmt)+));
        return;
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_recorded_with_the_test_name_and_reason() {
        let path = std::env::temp_dir().join(format!("vibeos-testkit-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        // This test binary has one test, so no other thread reads the environment meanwhile.
        std::env::set_var(SKIP_LOG_ENV, &path);
        record_skip(&"no daemon\there");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "tests::a_skip_is_recorded_with_the_test_name_and_reason\tno daemon here\n"
        );
    }
}
