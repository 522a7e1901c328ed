//! The tool traces a real program (a small static C fixture whose call order is known) under
//! ptrace and writes, appends and checks real list files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TOOL: &str = env!("CARGO_BIN_EXE_vibeos-link-order");

/// Builds `tests/fixtures/traced.c` into `dir` with the system C compiler (the one rustc links
/// with).
fn traced_fixture(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traced.c");
    let binary = dir.join("traced");
    let status = Command::new("cc")
        .args(["-static", "-O1", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .unwrap_or_else(|error| panic!("cannot run cc to build the fixture: {error}"));
    assert!(status.success(), "cc failed to build {}", source.display());
    binary
}

fn tool(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(TOOL)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {TOOL}: {error}"))
}

fn listed(list: &Path) -> Vec<String> {
    std::fs::read_to_string(list)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", list.display()))
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(str::to_owned)
        .collect()
}

fn position(names: &[String], name: &str) -> usize {
    names
        .iter()
        .position(|listed| listed == name)
        .unwrap_or_else(|| panic!("{name} is not in the list: {names:?}"))
}

fn record(binary: &Path, list: &Path, append: bool) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "record".as_ref(),
        "--binary".as_ref(),
        binary.as_os_str(),
        "--list".as_ref(),
        list.as_os_str(),
    ];
    if append {
        args.push("--append".as_ref());
    }
    args.extend(["--".as_ref(), binary.as_os_str()]);
    tool(&args)
}

#[test]
fn records_the_functions_a_program_runs_in_the_order_they_first_run_across_a_fork() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = traced_fixture(dir.path());
    let list = dir.path().join("order.txt");

    let output = record(&binary, &list, false);
    assert!(
        output.status.success(),
        "record failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&list).expect("the list was written");
    assert!(
        text.starts_with("# "),
        "the list starts with its header comment"
    );
    let names = listed(&list);
    let main = position(&names, "main");
    let first = position(&names, "first_called");
    let second = position(&names, "second_called");
    // The forked child is traced until it executes /bin/true, the parent after the child.
    let child = position(&names, "in_forked_child");
    let after = position(&names, "after_the_child");
    assert!(
        main < first && first < second && second < child && child < after,
        "{names:?}"
    );
    assert!(
        !names.iter().any(|name| name == "never_called"),
        "{names:?}"
    );
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "no function is listed twice");
}

#[test]
fn append_keeps_the_listed_functions_first_and_adds_only_new_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = traced_fixture(dir.path());
    let list = dir.path().join("order.txt");
    std::fs::write(
        &list,
        "# kept\nname_from_an_earlier_workload\nafter_the_child\n",
    )
    .expect("write list");

    let output = record(&binary, &list, true);
    assert!(
        output.status.success(),
        "record --append failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names = listed(&list);
    assert_eq!(names[0], "name_from_an_earlier_workload");
    assert_eq!(names[1], "after_the_child");
    assert_eq!(
        names
            .iter()
            .filter(|name| *name == "after_the_child")
            .count(),
        1
    );
    assert!(position(&names, "first_called") > 1);
}

#[test]
fn check_reports_the_share_still_in_the_binary_and_fails_below_the_minimum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = traced_fixture(dir.path());
    let list = dir.path().join("order.txt");
    std::fs::write(&list, "first_called\nsecond_called\ngone_one\ngone_two\n").expect("write");

    let check = |min: &str| {
        tool(&[
            "check".as_ref(),
            "--binary".as_ref(),
            binary.as_os_str(),
            "--list".as_ref(),
            list.as_os_str(),
            "--min-share".as_ref(),
            min.as_ref(),
        ])
    };
    let stale = check("0.9");
    assert_eq!(stale.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&stale.stdout);
    assert!(
        stdout.starts_with("2 of 4 listed functions are in"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&stale.stderr).contains("scripts/update-link-order"));

    assert_eq!(check("0.5").status.code(), Some(0));

    // A share outside 0..1 would make the check always fail or always pass.
    let wrong = check("90");
    assert_eq!(wrong.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("90 is not a share; give a number from 0 to 1"),
        "{stderr}"
    );
}

#[test]
fn a_command_that_never_runs_the_binary_is_an_error_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = traced_fixture(dir.path());
    let list = dir.path().join("order.txt");
    let output = tool(&[
        "record".as_ref(),
        "--binary".as_ref(),
        binary.as_os_str(),
        "--list".as_ref(),
        list.as_os_str(),
        "--".as_ref(),
        "/bin/true".as_ref(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("never executed"), "{stderr}");
    assert!(!list.exists());
}
