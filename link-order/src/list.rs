//! The list file: one symbol name per line, `#` comments (lld reads the same syntax).

use std::path::Path;

use crate::LinkOrderError;

/// What the list is, for whoever opens it; lld skips lines that start with `#`.
const HEADER: &str = "\
# Functions of the vibeos-exec binary that a cold `vibeos-exec run` executes, in the order
# it first executes them. cli/build.rs passes this file to the linker (lld's
# --symbol-ordering-file), which places them first and together in .text, so a cold run maps
# about 1 MB of code instead of 8 MB. Written by scripts/update-link-order; names the binary
# no longer has are skipped by the linker, so a stale list only costs speed.
";

/// Reads the names in `path`, skipping comments and blank lines.
pub fn read(path: &Path) -> Result<Vec<String>, LinkOrderError> {
    let text = std::fs::read_to_string(path).map_err(|source| LinkOrderError::List {
        action: "read",
        path: path.to_owned(),
        source,
    })?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

/// Writes `names` to `path` after the header.
pub fn write(path: &Path, names: &[String]) -> Result<(), LinkOrderError> {
    let mut text = String::from(HEADER);
    for name in names {
        text.push_str(name);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|source| LinkOrderError::List {
        action: "write",
        path: path.to_owned(),
        source,
    })
}
