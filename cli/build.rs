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
//!
//! The unwinder (the `_Unwind_*` functions panics and backtraces use) is linked from the C
//! compiler's static `libgcc_eh.a` instead of the shared `libgcc_s.so.1`, which std names for
//! it: with the archive first, `--as-needed` drops `libgcc_s` from the binary's libraries, and
//! every start saves that library's mapping, relocations and `cpuid` probe (0.11 ms for
//! `--version`; docs/cold-start.md, "Stop 45"). Only for `*-linux-gnu` targets without
//! `crt-static`, and only when the C compiler names the archive; `VIBEOS_STATIC_UNWIND=off`
//! keeps `libgcc_s`.

use std::process::Command;

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    println!("cargo:rerun-if-changed=link-order.txt");
    println!("cargo:rerun-if-env-changed=VIBEOS_LINK_ORDER");
    println!("cargo:rerun-if-env-changed=VIBEOS_STATIC_UNWIND");
    println!("cargo:rerun-if-env-changed=CC");
    // For every target of the package (the tests too, which check that panics still unwind).
    println!("cargo::rustc-check-cfg=cfg(vibeos_static_unwind)");
    if let Some(dir) = static_unwinder_dir() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static=gcc_eh");
        println!("cargo:rustc-cfg=vibeos_static_unwind");
    }
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

/// The directory of the C compiler's `libgcc_eh.a`, when the binary should link it.
fn static_unwinder_dir() -> Option<std::path::PathBuf> {
    let gnu = env("TARGET").ends_with("-linux-gnu");
    let crt_static = env("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if !gnu || crt_static || env("VIBEOS_STATIC_UNWIND") == "off" {
        return None;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    // A compiler that does not know the file prints its bare name back.
    let archive = std::path::PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    if !output.status.success() || !archive.is_absolute() || !archive.is_file() {
        return None;
    }
    archive.parent().map(std::path::Path::to_path_buf)
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
