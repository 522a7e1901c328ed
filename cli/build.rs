//! Link options for the `vibeos-exec` binary only (not the library crates, the tests or the
//! Python extension).
//!
//! `-z pack-relative-relocs` stores the binary's ~47,000 relative relocations as a 15 KB
//! bitmap (DT_RELR) instead of a 1.1 MB table of 24-byte entries, so the dynamic loader reads
//! and applies them in a fraction of the time: a cold `run` starts 0.5–0.7 ms sooner
//! (docs/cold-start.md). The binary stays position-independent (ASLR). A linker that does not
//! know the option (GNU ld before 2.38) warns and ignores it.
//!
//! `--symbol-ordering-file=link-order.txt` places the functions a cold `run` executes first
//! and together in `.text` (the list is written by scripts/update-link-order), so a cold run
//! maps about 1 MB of code instead of 8 MB (docs/cold-start.md, "Stop 34"). Only lld knows
//! the option, and GNU ld fails on it, so it is passed only when the linker is known to be
//! lld: rustc 1.90 or later linking for x86_64-unknown-linux-gnu with its own defaults (no
//! linker, linker feature or `-fuse-ld` chosen in RUSTFLAGS or cargo's configuration), in an
//! optimised build. `VIBEOS_LINK_ORDER=off` turns it off.

use std::process::Command;

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    println!("cargo:rerun-if-changed=link-order.txt");
    println!("cargo:rerun-if-env-changed=VIBEOS_LINK_ORDER");
    let list = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join("link-order.txt");
    if list.is_file() && links_with_default_lld() && optimised() && !turned_off() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        // Names a later build no longer has are expected (the list is regenerated now and
        // then, not on every change); lld would warn once per name.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn turned_off() -> bool {
    env("VIBEOS_LINK_ORDER") == "off"
}

fn optimised() -> bool {
    // The list names release-build symbols (their hashes include the profile), so a debug
    // build would find none of them.
    env("OPT_LEVEL") != "0"
}

/// Whether rustc will link with its bundled lld: its default for x86_64-unknown-linux-gnu
/// since 1.90, unless the build chose a linker of its own.
fn links_with_default_lld() -> bool {
    if env("TARGET") != "x86_64-unknown-linux-gnu" || std::env::var_os("RUSTC_LINKER").is_some() {
        return false;
    }
    let flags = env("CARGO_ENCODED_RUSTFLAGS");
    if ["linker", "link-self-contained", "fuse-ld"]
        .iter()
        .any(|chosen| flags.contains(chosen))
    {
        return false;
    }
    rustc_minor_version().is_some_and(|minor| minor >= 90)
}

/// The minor version of the rustc cargo builds with (`release: 1.95.0` → 95).
fn rustc_minor_version() -> Option<u32> {
    let output = Command::new(env("RUSTC")).arg("-vV").output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let release = text
        .lines()
        .find_map(|line| line.strip_prefix("release: "))?;
    let mut parts = release.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
