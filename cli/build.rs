//! Link options for the `vibeos-exec` binary only (not the library crates, the tests or the
//! Python extension).
//!
//! `-z pack-relative-relocs` stores the binary's ~47,000 relative relocations as a 15 KB
//! bitmap (DT_RELR) instead of a 1.1 MB table of 24-byte entries, so the dynamic loader reads
//! and applies them in a fraction of the time: a cold `run` starts 0.5–0.7 ms sooner
//! (docs/cold-start.md). The binary stays position-independent (ASLR). A linker that does not
//! know the option (GNU ld before 2.38) warns and ignores it.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
