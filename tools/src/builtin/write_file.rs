//! `write_file`: replace a file's content atomically, creating parent directories.

use super::args::{check_path, parse, schema_for};
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The arguments of `write_file`: its schema and its parser.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteFileArgs {
    /// File to write, absolute or relative to the working directory
    path: String,
    /// The complete new content
    content: String,
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "write_file",
        "file",
        "Write content to a file, replacing it atomically and creating parent directories. \
         Returns bytes_written.",
        schema_for::<WriteFileArgs>(),
        write_file,
    )
    .with_emoji("✍️")
    .with_path_scoped("path")
    .bounded()
}

inventory::submit! { BuiltinTool(entry) }

fn write_file(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    // With a remote backend the tool acts on that side's filesystem (SPEC §9).
    if let Some(remote) = crate::environments::agent::forward(
        "write_file",
        args,
        ctx,
        crate::environments::agent::FILE_TOOL_TIMEOUT,
    ) {
        return remote;
    }
    let a: WriteFileArgs = parse(args)?;
    let raw = check_path("path", &a.path)?;
    let content = a.content.as_str();
    // `sub/` names a directory: writing a file called `sub` would not be what was asked.
    if raw.ends_with('/') {
        return Err(ToolError::new(
            crate::ToolErrorKind::IsADirectory,
            format!("{raw} ends with `/`, so it names a directory; give a file path"),
        ));
    }
    // Not while a patch of the same file is between its read and its write.
    let _locked = super::file_lock::lock(&[ctx.resolve(raw)]);
    // The wait may have outlived the call's execution: nothing is written for it then.
    if crate::call_scope::scope_ended(ctx) {
        return Err(crate::call_scope::abandoned("write_file"));
    }
    if let Some(policy) = &ctx.paths {
        // Strict mode: beneath a writable root, never through a link.
        let created = policy.write_atomic(&ctx.resolve(raw), content.as_bytes())?;
        return Ok(json!({
            "path": raw,
            "bytes_written": content.len(),
            "created": created,
        }));
    }
    // Write through a symlink to its target, so a linked file stays linked.
    let given = ctx.resolve(raw);
    let path = link_target(given.clone())?;
    let through_link = path != given;
    // What is at the path now (following links), looked up once for every check below.
    let existing = std::fs::metadata(&path).ok();
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(ToolError::new(
            crate::ToolErrorKind::IsADirectory,
            format!("{} is a directory; give a file path", path.display()),
        ));
    }
    // The write replaces the file by a rename: over a device, FIFO or socket that would put a
    // regular file where the node was (`/dev/null` for every program on the machine).
    if existing.as_ref().is_some_and(|m| !m.is_file()) {
        return Err(ToolError::new(
            crate::ToolErrorKind::NotARegularFile,
            format!(
                "{} is a device, FIFO or socket; write_file writes regular files (it replaces \
                 the file whole, which would replace the node)",
                path.display()
            ),
        ));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => ctx.cwd.clone(),
    };
    // Parent directories are made for the path the caller gave, not for wherever a link
    // there points: a stale link (`x -> /nonexistent/x`) made `/nonexistent` as root, and an
    // `open(path, "w")` through it fails the same way.
    if through_link && !parent.is_dir() {
        return Err(ToolError::new(
            crate::ToolErrorKind::FileNotFound,
            format!(
                "{raw} is a symlink to {}, whose directory {} does not exist; write_file makes \
                 parent directories only for the path it is given (write the target's path \
                 itself, or remove the link)",
                path.display(),
                parent.display()
            ),
        ));
    }
    std::fs::create_dir_all(&parent).map_err(|e| parent_error(&parent, &e))?;
    let existed = existing.is_some();
    let old_perms = existing.as_ref().map(|m| m.permissions());
    // Write beside the target and rename over it: readers see the old or the new file, never a
    // half-written one.
    let mut tmp = tempfile::Builder::new()
        .prefix(".vibeos-write-")
        .tempfile_in(&parent)
        .map_err(|e| temp_file_error(&parent, &path, &e))?;
    tmp.write_all(content.as_bytes())
        .and_then(|_| tmp.flush())
        .map_err(|e| ToolError::io(&path, &e))?;
    // Keep an existing file's mode; a new file gets the usual 0644 rather than the temp
    // file's private 0600.
    let perms = old_perms.unwrap_or_else(|| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(0o644)
    });
    if let Some(replaced) = &existing {
        use std::os::unix::fs::MetadataExt;
        crate::path_policy::keep_owner(tmp.as_file(), replaced.uid(), replaced.gid());
    }
    let _ = tmp.as_file().set_permissions(perms);
    tmp.persist(&path)
        .map_err(|e| ToolError::io(&path, &e.error))?;
    let mut result = json!({
        "path": raw,
        "bytes_written": content.len(),
        "created": !existed,
    });
    // Through a link the file written is another one: say which.
    if let (true, Some(o)) = (through_link, result.as_object_mut()) {
        o.insert("written_to".into(), json!(path.display().to_string()));
    }
    Ok(result)
}

/// Where a write of `path` lands: the end of its chain of symlinks, as `open(path, "w")` would
/// write. A link whose target does not exist yet leads to that target, which the write
/// creates; replacing the link itself would cut what the link's owner set up.
fn link_target(path: PathBuf) -> Result<PathBuf, ToolError> {
    // The kernel's own limit on links followed in one lookup.
    const MAX_LINKS: usize = 40;
    let mut current = path;
    for _ in 0..MAX_LINKS {
        let target = match std::fs::read_link(&current) {
            Ok(target) => target,
            // Not a link (or nothing there): the write goes here.
            Err(_) => return Ok(current),
        };
        current = match current.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    Err(ToolError::new(
        crate::ToolErrorKind::IoError,
        format!(
            "{} leads through more than {MAX_LINKS} symbolic links (a loop?); give the file's own path",
            current.display()
        ),
    ))
}

/// Why no new file could be made in `parent` to replace `path` with. tempfile's error names
/// its random temp path ("… at path /proc/.vibeos-write-XYZ"), which the caller never gave;
/// and in a directory that exists but takes no new files (`/proc`, `/sys`) the OS says ENOENT,
/// which as `FileNotFound` read as if the directory were missing.
fn temp_file_error(parent: &Path, path: &Path, e: &std::io::Error) -> ToolError {
    // The OS error itself, without tempfile's path: its error wraps the OS error in a private
    // type that shows as "<os error> at path <temp path>" and gives no way back to the inner
    // error, so the suffix is cut off its text.
    let text = e.to_string();
    let cause = text.split(" at path ").next().unwrap_or(&text);
    let message = format!(
        "cannot write {}: no new file can be created in {} ({cause}); write_file writes the \
         content to a new file beside the target and renames it over the target, so the \
         directory must accept new files (a virtual filesystem such as /proc or /sys, or a \
         read-only one, does not)",
        path.display(),
        parent.display()
    );
    let kind = if e.kind() == std::io::ErrorKind::NotFound && parent.is_dir() {
        crate::ToolErrorKind::WriteError
    } else {
        ToolError::io(parent, e).kind
    };
    ToolError::new(kind, message)
}

/// Why the parent dir `parent` could not be made: a file where a directory of the path
/// should be is `NotADirectory` naming it (create_dir_all says "File exists", which read as
/// if the target itself were there).
fn parent_error(parent: &Path, e: &std::io::Error) -> ToolError {
    if matches!(
        e.kind(),
        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory
    ) {
        if let Some(file) = parent.ancestors().find(|a| a.is_file()) {
            let message = if file == parent {
                format!(
                    "{} is a file, so nothing can be created beneath it; choose another path",
                    file.display()
                )
            } else {
                format!(
                    "{} is a file, so {} cannot be a directory beneath it; choose another path",
                    file.display(),
                    parent.display()
                )
            };
            return ToolError::new(crate::ToolErrorKind::NotADirectory, message);
        }
    }
    ToolError::io(parent, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_ending_in_a_slash_names_a_directory_and_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let ctx = ToolContext::agent(d.path());
        let args = json!({"path": "sub/", "content": "x"});
        let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::IsADirectory, "{e:?}");
        assert!(!d.path().join("sub").exists());
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_and_left_as_it_was() {
        use std::os::unix::fs::FileTypeExt;
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // A symlink to it too: the write follows links, and the link's target is the FIFO.
        std::os::unix::fs::symlink("pipe", d.path().join("link")).unwrap();
        let ctx = ToolContext::agent(d.path());
        for path in ["pipe", "link"] {
            let args = json!({"path": path, "content": "data"});
            let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
            assert_eq!(e.kind, crate::ToolErrorKind::NotARegularFile, "{e:?}");
            assert!(e.message.contains("device, FIFO or socket"), "{e:?}");
        }
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
        // /dev/null stays a device: the write is refused before any file is made beside it.
        let args = json!({"path": "/dev/null", "content": "data"});
        let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::NotARegularFile, "{e:?}");
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn writes_through_symlinks_and_creates_parents() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("real.txt"), "old").unwrap();
        std::os::unix::fs::symlink("real.txt", d.path().join("link.txt")).unwrap();
        let ctx = ToolContext::agent(d.path());
        let args = json!({"path": "link.txt", "content": "new"});
        write_file(args.as_object().unwrap(), &ctx).unwrap();
        assert!(d.path().join("link.txt").is_symlink());
        assert_eq!(
            std::fs::read_to_string(d.path().join("real.txt")).unwrap(),
            "new"
        );
        let args = json!({"path": "a/b/c.txt", "content": "deep"});
        let r = write_file(args.as_object().unwrap(), &ctx).unwrap();
        assert_eq!(r["bytes_written"], 4);
        assert_eq!(r["created"], true);
        let args = json!({"path": "a", "content": "x"});
        assert_eq!(
            write_file(args.as_object().unwrap(), &ctx)
                .unwrap_err()
                .kind,
            "IsADirectory"
        );
        // A file where the path needs a directory: named as such, not "File exists".
        for path in ["real.txt/x.txt", "real.txt/sub/x.txt"] {
            let args = json!({"path": path, "content": "x"});
            let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
            assert_eq!(e.kind, "NotADirectory", "{path}: {e:?}");
            assert!(e.message.contains("real.txt is a file"), "{path}: {e:?}");
        }
    }

    #[test]
    fn a_link_to_a_file_not_made_yet_is_kept_and_its_target_written() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("conf")).unwrap();
        // A chain: dangling.txt -> conf/hop -> settings.yaml (relative to conf), not there yet.
        std::os::unix::fs::symlink("conf/hop", d.path().join("dangling.txt")).unwrap();
        std::os::unix::fs::symlink("settings.yaml", d.path().join("conf/hop")).unwrap();
        let ctx = ToolContext::agent(d.path());
        let args = json!({"path": "dangling.txt", "content": "k: v\n"});
        let r = write_file(args.as_object().unwrap(), &ctx).unwrap();
        assert_eq!(r["created"], true);
        assert!(d.path().join("dangling.txt").is_symlink());
        assert!(d.path().join("conf/hop").is_symlink());
        assert_eq!(
            std::fs::read_to_string(d.path().join("conf/settings.yaml")).unwrap(),
            "k: v\n"
        );
        assert_eq!(
            r["written_to"],
            d.path().join("conf/settings.yaml").display().to_string()
        );
        // A link whose target's directory is missing: nothing is made there (a stale link to
        // `/nonexistent/x` made `/nonexistent` as root); the link stays.
        let far = d.path().join("far");
        std::os::unix::fs::symlink(far.join("deeper/x"), d.path().join("stale")).unwrap();
        let args = json!({"path": "stale", "content": "x"});
        let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::FileNotFound, "{e:?}");
        assert!(
            e.message.contains("is a symlink to")
                && e.message
                    .contains("does not exist; write_file makes parent directories only"),
            "{e:?}"
        );
        assert!(!far.exists());
        assert!(d.path().join("stale").is_symlink());
        // A plain path still gets its parents made, and says nothing of links.
        let args = json!({"path": "new/dir/f.txt", "content": "x"});
        let r = write_file(args.as_object().unwrap(), &ctx).unwrap();
        assert!(r.get("written_to").is_none(), "{r}");
        // A loop is refused, and both links stay.
        std::os::unix::fs::symlink("loop-b", d.path().join("loop-a")).unwrap();
        std::os::unix::fs::symlink("loop-a", d.path().join("loop-b")).unwrap();
        let args = json!({"path": "loop-a", "content": "x"});
        let e = write_file(args.as_object().unwrap(), &ctx).unwrap_err();
        assert!(e.message.contains("symbolic links"), "{e:?}");
        assert!(d.path().join("loop-a").is_symlink() && d.path().join("loop-b").is_symlink());
    }

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<WriteFileArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to write, absolute or relative to the working directory"},
                    "content": {"type": "string", "description": "The complete new content"}
                },
                "required": ["path", "content"]
            }),
            json!({"path": "out/report.md", "content": "# Report\n"}),
            json!({"path": "x", "content": 42}),
        );
    }
}
