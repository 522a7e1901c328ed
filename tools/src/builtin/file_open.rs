//! Opening a file a file tool reads, the same way for every tool: beneath the allowed roots in
//! strict mode, never waiting on a FIFO, and only once it is known to be a regular file.

use crate::{ToolContext, ToolError};
use std::fs::{File, Metadata};
use std::path::Path;

/// What a tool says when `path` is not a file it works on.
pub(crate) struct Refusals {
    /// Appended to "{path} is a directory" (advice, or empty).
    pub directory: &'static str,
    /// Appended to "{path} is not a regular file (a device, FIFO or socket); ".
    pub not_a_file: &'static str,
}

/// Opens `path` for reading and returns it with its metadata, once the descriptor is known to
/// be a regular file. Strict mode resolves it beneath an allowed root
/// ([`crate::path_policy::PathPolicy::open_read`]); either way the open uses `O_NONBLOCK`, so a
/// FIFO's open does not wait for a writer before the check refuses it (on a regular file it
/// changes nothing). A device never ends (`/dev/zero`) or is no file to rewrite (`/dev/null`).
pub(crate) fn open_regular_file(
    path: &Path,
    ctx: &ToolContext,
    refusals: Refusals,
) -> Result<(File, Metadata), ToolError> {
    let file = match &ctx.paths {
        Some(policy) => policy.open_read(path)?,
        None => open_nonblocking(path).map_err(|e| ToolError::io(path, &e))?,
    };
    let meta = file.metadata().map_err(|e| ToolError::io(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::new(
            crate::ToolErrorKind::IsADirectory,
            format!("{} is a directory{}", path.display(), refusals.directory),
        ));
    }
    if !meta.is_file() {
        return Err(ToolError::new(
            crate::ToolErrorKind::NotARegularFile,
            format!(
                "{} is not a regular file (a device, FIFO or socket); {}",
                path.display(),
                refusals.not_a_file
            ),
        ));
    }
    Ok((file, meta))
}

/// Opens `path` for reading with `O_NONBLOCK`: a FIFO's open does not wait for a writer, and a
/// read of a file that has no data yet (`/proc/kmsg`) returns instead of holding the thread.
pub(crate) fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}
