//! The crate's shape: its modules depend on each other bottom-up, without cycles (issue 16),
//! checked by `scripts/module-cycles` over this crate's sources so that a new cycle fails CI.

#[test]
fn modules_have_no_dependency_cycles() {
    vibeos_testkit::assert_no_module_cycles(env!("CARGO_MANIFEST_DIR"));
}
