//! The crate's shape: its modules depend on each other bottom-up, without cycles (issue 16),
//! checked by `scripts/module-cycles` over this crate's sources so that a new cycle fails CI.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn modules_have_no_dependency_cycles() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir.parent().expect("the crate sits in the workspace");
    let out = Command::new("python3")
        .arg(root.join("scripts/module-cycles"))
        .arg(crate_dir.join("src"))
        .output()
        .expect("python3 runs scripts/module-cycles");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "module cycles in tools/src (move the shared items into a module below both):\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("no cycles"), "{report}");
}
