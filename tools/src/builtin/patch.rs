//! `patch`: targeted edits without rewriting whole files.
//!
//! `mode="replace"` (default) swaps `old_string` for `new_string` in one file. Exact matching
//! comes first; when the text is not found verbatim, a whitespace-tolerant line match is tried
//! (leading/trailing whitespace and runs of blanks ignored, the file's indentation carried over
//! to the new text). Either way more than one match is refused unless `replace_all` is set, so an
//! edit never lands somewhere the caller did not mean.
//!
//! `mode="patch"` applies a unified diff that may touch several files (git-style `a/`/`b/`
//! prefixes and `/dev/null` for created or deleted files understood). Hunks are applied with the
//! `diffy` crate, which tolerates shifted line numbers but not changed context. Every file is
//! patched in memory first; if any hunk fails nothing is written and the error names the file and
//! hunk. Files are then replaced atomically one by one.
//!
//! Both modes return a unified diff of what changed.

use super::args::{check_path, parse, schema_for};
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Largest file `patch` edits.
const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Largest argument text (old/new string, patch text).
const MAX_ARG_BYTES: usize = 8 * 1024 * 1024;
/// Most files one multi-file patch changes. An edit holds the locks of its files from its
/// first read to its last write ([`super::file_lock`]), and 80,000 files took every stripe
/// (every other execution's writes waited) for 160 s.
const MAX_PATCH_FILES: usize = 1000;
/// Most bytes of old and new text one multi-file patch holds in memory (the supervisor's,
/// which no script limit bounds): every change is planned before the first write.
const MAX_PATCH_PLAN_BYTES: u64 = 128 * 1024 * 1024;

/// The arguments of `patch`: its schema and its parser. Which ones are needed depends on
/// `mode`, so none is required by the schema; the handler names a missing one.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PatchArgs {
    /// File to edit (mode=replace)
    path: Option<String>,
    /// Text to find (mode=replace); include enough context to be unique
    old_string: Option<String>,
    /// Replacement text (mode=replace)
    new_string: Option<String>,
    /// Replace every match instead of refusing when there are several
    #[serde(default)]
    replace_all: bool,
    #[serde(default)]
    mode: PatchMode,
    /// Unified diff text (mode=patch)
    patch: Option<String>,
}

// `mode`: one replacement, or a unified diff. (No doc comment: it would become the schema's
// description of the argument, which the tool has never had.)
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum PatchMode {
    #[default]
    Replace,
    Patch,
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "patch",
        "file",
        "Edit files. mode=\"replace\" (default): replace old_string with new_string in path — exact \
         match first, then a whitespace/indentation-tolerant match; ambiguous matches are refused \
         unless replace_all. mode=\"patch\": apply a unified diff (may touch several files; nothing \
         is written if any hunk fails). Returns the diff of what changed.",
        schema_for::<PatchArgs>(),
        patch,
    )
    .with_emoji("🩹")
    .with_path_scoped("path")
}

inventory::submit! { BuiltinTool(entry) }

fn limited<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, ToolError> {
    let s = value
        .as_deref()
        .ok_or_else(|| ToolError::invalid_args(format!("missing required argument `{name}`")))?;
    if s.len() > MAX_ARG_BYTES {
        return Err(ToolError::invalid_args(format!(
            "argument `{name}` is {} bytes; the limit is {MAX_ARG_BYTES}",
            s.len()
        )));
    }
    Ok(s)
}

fn patch(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    // With a remote backend the tool acts on that side's filesystem (SPEC §9).
    if let Some(remote) = crate::environments::agent::forward(
        "patch",
        args,
        ctx,
        crate::environments::agent::FILE_TOOL_TIMEOUT,
    ) {
        return remote;
    }
    let a: PatchArgs = parse(args)?;
    // Arguments of the other mode were ignored without a word: `mode="replace"` with a diff
    // in `patch` (the mode forgotten) failed on a missing `old_string`, and a diff applied with
    // `old_string` given edited what the diff said, not what the caller looked for.
    let other_mode: Vec<&str> = match a.mode {
        PatchMode::Replace => [("patch", a.patch.is_some())]
            .into_iter()
            .filter_map(|(n, set)| set.then_some(n))
            .collect(),
        PatchMode::Patch => [
            ("old_string", a.old_string.is_some()),
            ("new_string", a.new_string.is_some()),
            ("replace_all", a.replace_all),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect(),
    };
    if !other_mode.is_empty() {
        let (mode, other) = match a.mode {
            PatchMode::Replace => ("replace", "patch"),
            PatchMode::Patch => ("patch", "replace"),
        };
        return Err(ToolError::invalid_args(format!(
            "argument{} `{}` belong{} to mode=\"{other}\", not to mode=\"{mode}\" (the \
             default is replace); pass mode=\"{other}\" or leave {} out",
            if other_mode.len() > 1 { "s" } else { "" },
            other_mode.join("`, `"),
            if other_mode.len() > 1 { "" } else { "s" },
            if other_mode.len() > 1 { "them" } else { "it" },
        )));
    }
    match a.mode {
        PatchMode::Replace => replace_mode(&a, ctx),
        PatchMode::Patch => patch_mode(limited(&a.patch, "patch")?, ctx),
    }
}

/// Reads a file `patch` may edit: exists, regular, not huge, UTF-8 text.
fn read_text(path: &Path, ctx: &ToolContext) -> Result<String, ToolError> {
    use std::io::Read;
    let (file, meta) = super::file_open::open_regular_file(
        path,
        ctx,
        super::file_open::Refusals {
            directory: "",
            not_a_file: "patch only edits files",
        },
    )?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::new(
            crate::ToolErrorKind::FileTooLarge,
            format!(
                "{} is {} bytes; patch edits files up to {MAX_FILE_BYTES} bytes",
                path.display(),
                meta.len()
            ),
        ));
    }
    // Capped as well: the file may grow between the check and the read.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::io(path, &e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ToolError::new(
            crate::ToolErrorKind::FileTooLarge,
            format!(
                "{} grew past {MAX_FILE_BYTES} bytes while it was read; patch edits files up \
                 to {MAX_FILE_BYTES} bytes",
                path.display()
            ),
        ));
    }
    if bytes.contains(&0) {
        return Err(ToolError::new(
            crate::ToolErrorKind::BinaryFile,
            format!(
                "{} looks binary (it contains NUL bytes); patch only edits text",
                path.display()
            ),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        ToolError::new(
            "NotUtf8",
            format!(
                "{} is not valid UTF-8 (first bad byte at offset {}); patch cannot edit it without \
                 corrupting it",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Replaces `path` atomically, keeping its mode (0644 for new files).
/// Removes a file the patch deletes (or, undoing, one it created).
fn remove_planned(path: &Path, ctx: &ToolContext) -> Result<(), ToolError> {
    match &ctx.paths {
        Some(policy) => policy.remove_file(path),
        None => std::fs::remove_file(path).map_err(|e| ToolError::io(path, &e)),
    }
}

/// The dirs above `path` (up to `cwd` for a relative one) that do not exist yet, outermost
/// first.
fn missing_dirs(path: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut missing: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .take_while(|d| !d.as_os_str().is_empty() && *d != cwd && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    missing
}

fn atomic_write(path: &Path, content: &str, ctx: &ToolContext) -> Result<(), ToolError> {
    // A large file's matching (or the file lock's wait) may have outlived the call's
    // execution: nothing is written for it then.
    if crate::call_scope::scope_ended(ctx) {
        return Err(crate::call_scope::abandoned("patch"));
    }
    write_now(path, content, ctx)
}

/// [`atomic_write`] without the question whether the execution goes on (an undo).
fn write_now(path: &Path, content: &str, ctx: &ToolContext) -> Result<(), ToolError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(policy) = &ctx.paths {
        return policy.write_atomic(path, content.as_bytes()).map(|_| ());
    }
    // Edit a symlink's target, so a linked file stays linked.
    let resolved;
    let path = if path.is_symlink() {
        resolved = std::fs::canonicalize(path).map_err(|e| ToolError::io(path, &e))?;
        resolved.as_path()
    } else {
        path
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| ToolError::io(&parent, &e))?;
    let replaced = std::fs::metadata(path).ok();
    let perms = replaced
        .as_ref()
        .map(|m| m.permissions())
        .unwrap_or_else(|| std::fs::Permissions::from_mode(0o644));
    let mut tmp = tempfile::Builder::new()
        .prefix(".vibeos-patch-")
        .tempfile_in(&parent)
        .map_err(|e| ToolError::io(&parent, &e))?;
    tmp.write_all(content.as_bytes())
        .and_then(|_| tmp.flush())
        .map_err(|e| ToolError::io(path, &e))?;
    if let Some(replaced) = &replaced {
        use std::os::unix::fs::MetadataExt;
        crate::path_policy::keep_owner(tmp.as_file(), replaced.uid(), replaced.gid());
    }
    let _ = tmp.as_file().set_permissions(perms);
    tmp.persist(path)
        .map_err(|e| ToolError::io(path, &e.error))?;
    Ok(())
}

/// Which side of a change a file is missing from: it decides a diff's `/dev/null` label.
#[derive(Clone, Copy, PartialEq)]
enum Change {
    Modified,
    Created,
    Deleted,
}

/// The unified diff of one file's change, labelled as `git diff` labels it: a created file's
/// old side and a deleted file's new side are `/dev/null`, so `git apply` or `patch` given the
/// returned diff creates or deletes the file instead of leaving an empty one.
///
/// An absolute path keeps its name without the `a/`/`b/` prefixes (`b//tmp/x` is no path any
/// tool applies); patch mode takes it back as it is, though `git apply` refuses absolute paths.
/// Most lines a diff's changed region (old and new lines together, common first and last
/// lines aside) may span for the diff to be computed: its cost grows with the file's length
/// times the number of changed lines, and `replace_all` over a 100,000-line file kept a core
/// busy for over ten minutes. Past it the result says how large the change is instead.
const MAX_DIFF_CHANGED_LINES: usize = 10_000;

/// How many lines of `old` and of `new` lie between their common first and last lines.
fn changed_lines(old: &str, new: &str) -> (usize, usize) {
    let (a, b): (Vec<&str>, Vec<&str>) = (
        old.split_inclusive('\n').collect(),
        new.split_inclusive('\n').collect(),
    );
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (a.len() - head - tail, b.len() - head - tail)
}

fn diff(name: &str, old: &str, new: &str, change: Change) -> String {
    let (gone, came) = changed_lines(old, new);
    if gone + came > MAX_DIFF_CHANGED_LINES {
        return format!(
            "(no diff for {name}: the change spans {gone} old and {came} new lines, more than \
             the {MAX_DIFF_CHANGED_LINES} a diff is made for; read the file to see it)\n"
        );
    }
    let p = diffy::create_patch(old, new);
    let body = p.to_string();
    let side = |prefix: &str| {
        if name.starts_with('/') {
            name.to_string()
        } else {
            format!("{prefix}{name}")
        }
    };
    let old_label = match change {
        Change::Created => "/dev/null".to_string(),
        _ => side("a/"),
    };
    let new_label = match change {
        Change::Deleted => "/dev/null".to_string(),
        _ => side("b/"),
    };
    // diffy labels the sides "original"/"modified"; name the file instead.
    body.replacen("--- original", &format!("--- {old_label}"), 1)
        .replacen("+++ modified", &format!("+++ {new_label}"), 1)
}

fn replace_mode(a: &PatchArgs, ctx: &ToolContext) -> Result<Value, ToolError> {
    let raw = check_path("path", limited(&a.path, "path")?)?;
    let old = limited(&a.old_string, "old_string")?;
    let new = limited(&a.new_string, "new_string")?;
    let replace_all = a.replace_all;
    if old.is_empty() {
        return Err(ToolError::invalid_args(
            "argument `old_string` is empty; use write_file to create or overwrite a whole file",
        ));
    }
    if old == new {
        return Err(ToolError::invalid_args(
            "`old_string` and `new_string` are identical; nothing to change",
        ));
    }
    let path = ctx.resolve(raw);
    // From the read to the write: another edit of the file waits (docs in file_lock).
    let _locked = super::file_lock::lock(std::slice::from_ref(&path));
    let text = read_text(&path, ctx)?;
    let exact = text.matches(old).count();
    let (updated, replacements, strategy) = if exact == 1 || (exact > 1 && replace_all) {
        // Measured before it is built: a 1 MiB file of one letter, each replaced by 3,000
        // bytes, took the supervisor (which the script's memory limit does not bound) past
        // 2.8 GB before the write failed.
        let size = text.len() - exact * old.len() + exact.saturating_mul(new.len());
        if size as u64 > MAX_FILE_BYTES {
            return Err(too_large_after(raw, Some(size)));
        }
        (text.replace(old, new), exact, "exact")
    } else if exact > 1 {
        return Err(ToolError::new(
            crate::ToolErrorKind::AmbiguousMatch,
            format!(
                "old_string occurs {exact} times in {raw}; include more surrounding lines to make \
                 it unique, or set replace_all=true"
            ),
        ));
    } else {
        let (t, n) = fuzzy_replace(&text, old, new, replace_all).map_err(|e| match e {
            Fuzzy::NotFound => ToolError::new(
                crate::ToolErrorKind::NoMatch,
                format!(
                    "old_string was not found in {raw}, not even ignoring whitespace and \
                     indentation. Read the file again (read_file) and copy the text exactly"
                ),
            ),
            Fuzzy::TooLarge => too_large_after(raw, None),
            Fuzzy::Ambiguous(n) => ToolError::new(
                crate::ToolErrorKind::AmbiguousMatch,
                format!(
                    "old_string matches {n} places in {raw} when whitespace is ignored (and none \
                     exactly); include more surrounding lines to make it unique, or set \
                     replace_all=true"
                ),
            ),
        })?;
        (t, n, "whitespace-tolerant")
    };
    atomic_write(&path, &updated, ctx)?;
    Ok(json!({
        "path": raw,
        "replacements": replacements,
        "match": strategy,
        "diff": diff(raw, &text, &updated, Change::Modified),
    }))
}

enum Fuzzy {
    NotFound,
    Ambiguous(usize),
    /// The file would grow past [`MAX_FILE_BYTES`].
    TooLarge,
}

/// The refusal of an edit whose result would be larger than patch edits (`size` when known).
fn too_large_after(raw: &str, size: Option<usize>) -> ToolError {
    let size = size.map(|n| format!(" ({n} bytes)")).unwrap_or_default();
    ToolError::new(
        crate::ToolErrorKind::FileTooLarge,
        format!(
            "the edit would make {raw} larger than the {MAX_FILE_BYTES} bytes patch edits{size}; \
             nothing was changed. Replace fewer matches, or a shorter new_string"
        ),
    )
}

fn squash(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Line-window match ignoring whitespace differences; re-indents `new` to the file's indentation.
fn fuzzy_replace(text: &str, old: &str, new: &str, all: bool) -> Result<(String, usize), Fuzzy> {
    let needle: Vec<&str> = old.lines().collect();
    let first = needle.iter().position(|l| !l.trim().is_empty());
    let last = needle.iter().rposition(|l| !l.trim().is_empty());
    let (Some(first), Some(last)) = (first, last) else {
        return Err(Fuzzy::NotFound);
    };
    let needle = &needle[first..=last];
    let want: Vec<String> = needle.iter().map(|l| squash(l)).collect();
    // Keep each line's terminator so CRLF files and a missing final newline survive.
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let norm: Vec<String> = lines.iter().map(|l| squash(l)).collect();
    let hits = occurrences(&norm, &want, false);
    match hits.len() {
        0 => return Err(Fuzzy::NotFound),
        n if n > 1 && !all => return Err(Fuzzy::Ambiguous(n)),
        _ => {}
    }
    let mut out = String::with_capacity(text.len() + new.len());
    let mut pos = 0;
    for &h in &hits {
        out.extend(lines[pos..h].iter().copied());
        let indents = Indents::aligned(needle, &lines[h..h + want.len()]);
        let last_line = lines[h + want.len() - 1];
        let eol = if last_line.ends_with("\r\n") {
            "\r\n"
        } else if last_line.ends_with('\n') {
            "\n"
        } else {
            ""
        };
        if !new.is_empty() {
            let joint = if eol == "\r\n" { "\r\n" } else { "\n" };
            for (i, line) in new.trim_end_matches('\n').lines().enumerate() {
                if i > 0 {
                    out.push_str(joint);
                }
                // Bounded as it grows, line by line: each line takes the file's indent, which
                // can be far longer than the line.
                if !indents.reindent_into(line, &mut out, MAX_FILE_BYTES) {
                    return Err(Fuzzy::TooLarge);
                }
            }
            out.push_str(eol);
        }
        pos = h + want.len();
    }
    out.extend(lines[pos..].iter().copied());
    Ok((out, hits.len()))
}

/// Where `want` starts in `hay`, left to right: every start when `overlapping`, else each match
/// after the end of the one before. Linear in both lengths (Knuth–Morris–Pratt): comparing
/// window by window cost O(n·m) on repetitive text, so a patch of 50,000 equal lines against a
/// file of 200,000 kept a core busy for half a minute after its execution had ended.
fn occurrences<T: PartialEq>(hay: &[T], want: &[T], overlapping: bool) -> Vec<usize> {
    let m = want.len();
    if m == 0 {
        return Vec::new();
    }
    // fail[q]: the length of the longest proper prefix of want[..=q] that is also its suffix.
    let mut fail = vec![0usize; m];
    let mut k = 0;
    for q in 1..m {
        while k > 0 && want[q] != want[k] {
            k = fail[k - 1];
        }
        if want[q] == want[k] {
            k += 1;
        }
        fail[q] = k;
    }
    let mut hits = Vec::new();
    let mut k = 0;
    for (i, item) in hay.iter().enumerate() {
        while k > 0 && *item != want[k] {
            k = fail[k - 1];
        }
        if *item == want[k] {
            k += 1;
        }
        if k == m {
            hits.push(i + 1 - m);
            k = if overlapping { fail[m - 1] } else { 0 };
        }
    }
    hits
}

/// How the indentation of `old_string` maps onto the file's where a whitespace-tolerant match
/// found it: each indent of the old text's lines to the indent of the file line it matched
/// (tabs for spaces, four spaces for two), and the step of one level on each side, for new
/// lines nested deeper than any old one. Re-indenting only the first line's prefix left the
/// other lines with the old text's spaces in a tab-indented file (a `TabError` in Python).
struct Indents {
    /// (old text's indent, file's indent), deepest first, so the longest prefix is found first.
    pairs: Vec<(String, String)>,
    /// One level of indentation in the old text and in the file, when both can be told.
    step: Option<(String, String)>,
}

impl Indents {
    fn aligned(needle: &[&str], matched: &[&str]) -> Self {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (old, file) in needle.iter().zip(matched) {
            if old.trim().is_empty() {
                continue;
            }
            let (o, f) = (indent_of(old), indent_of(line_text(file)));
            if !pairs.iter().any(|(k, _)| k == o) {
                pairs.push((o.to_string(), f.to_string()));
            }
        }
        pairs.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        // A level: the difference between two mapped indents one inside the other on both
        // sides (`    ` → `\t` from `    `/`\t` and `        `/`\t\t`).
        let step = pairs.iter().find_map(|(deep_o, deep_f)| {
            pairs.iter().find_map(|(o, f)| {
                let extra_o = deep_o.strip_prefix(o.as_str()).filter(|x| !x.is_empty())?;
                let extra_f = deep_f.strip_prefix(f.as_str()).filter(|x| !x.is_empty())?;
                Some((extra_o.to_string(), extra_f.to_string()))
            })
        });
        Indents { pairs, step }
    }

    /// Appends `line` of the new text to `out` with its indent translated to the file's;
    /// `false` (and `out` left longer than `limit`) once `out` grows past `limit` bytes: a
    /// file's indent and its level can each be long, and a level is repeated for each level of
    /// the line's own indent.
    fn reindent_into(&self, line: &str, out: &mut String, limit: u64) -> bool {
        let within = |out: &String| out.len() as u64 <= limit;
        let Some((old, file)) = self
            .pairs
            .iter()
            .find(|(old, _)| indent_of(line).starts_with(old.as_str()))
            .filter(|_| !line.trim().is_empty())
        else {
            out.push_str(line);
            return within(out);
        };
        let indent = indent_of(line);
        let body = &line[indent.len()..];
        let mut extra = &indent[old.len()..];
        out.push_str(file);
        if let Some((step_old, step_file)) = &self.step {
            while let Some(rest) = extra.strip_prefix(step_old.as_str()) {
                out.push_str(step_file);
                if !within(out) {
                    return false;
                }
                extra = rest;
            }
        }
        out.push_str(extra);
        out.push_str(body);
        within(out)
    }
}

/// One file's part of a multi-file diff.
struct FilePatch {
    old_name: Option<String>,
    new_name: Option<String>,
    /// The headers and the hunks that carry line ranges (`@@ -l,n +l,n @@`).
    text: String,
    /// Hunks without ranges (a bare `@@`, or hunk lines right after the headers), as models
    /// often write them: placed by finding their old lines in the file ([`placed_hunks`]).
    loose: Vec<Vec<String>>,
}

/// `line` without its line end (`\n` or `\r\n`): what a diff's and a file's lines are compared
/// by, however either was written.
fn line_text(line: &str) -> &str {
    line.trim_end_matches(['\n', '\r'])
}

/// Whether `line` can be a line of a hunk's body: context, removed, added, or an empty line
/// (a context line whose space an editor stripped).
fn hunk_body_line(line: &str) -> bool {
    matches!(
        line.as_bytes().first(),
        Some(b' ' | b'-' | b'+' | b'\\' | b'\n' | b'\r')
    )
}

/// `loose` hunks given line ranges by where their old lines (context and removed) stand in
/// `old`: each must be found exactly once, after the one before it.
fn placed_hunks(name: &str, old: &str, loose: &[Vec<String>]) -> Result<String, ToolError> {
    let file: Vec<&str> = old.split_inclusive('\n').map(line_text).collect();
    let problem = |what: String| {
        ToolError::new(
            crate::ToolErrorKind::PatchError,
            format!("{name}: {what}. Nothing was written"),
        )
    };
    let mut out = String::new();
    let (mut from, mut shift) = (0usize, 0i64);
    for (n, hunk) in loose.iter().enumerate() {
        let body: Vec<(u8, &str)> = hunk
            .iter()
            .filter(|l| !l.starts_with('\\'))
            .map(|l| {
                let l = line_text(l);
                match l.as_bytes().first() {
                    Some(c @ (b' ' | b'-' | b'+')) => (*c, &l[1..]),
                    _ => (b' ', ""),
                }
            })
            .collect();
        let olds: Vec<&str> = body
            .iter()
            .filter(|(c, _)| *c != b'+')
            .map(|(_, t)| *t)
            .collect();
        let news = body.iter().filter(|(c, _)| *c != b'-').count();
        if olds.is_empty() {
            return Err(problem(format!(
                "hunk #{} has no context or removed lines to place it by; give it a `@@ -line,count \
                 +line,count @@` header",
                n + 1
            )));
        }
        let at: Vec<usize> = occurrences(file.get(from..).unwrap_or_default(), &olds, true)
            .into_iter()
            .map(|i| i + from)
            .collect();
        let start = match at.as_slice() {
            [one] => *one,
            [] => {
                return Err(problem(format!(
                    "the context and removed lines of hunk #{} are not in the file (after the \
                     hunk before it); read the file again and regenerate the diff",
                    n + 1
                )))
            }
            many => {
                return Err(problem(format!(
                    "the context and removed lines of hunk #{} occur {} times in the file; add \
                     context lines, or give the hunk a `@@ -line,count +line,count @@` header",
                    n + 1,
                    many.len()
                )))
            }
        };
        let old_start = start + 1;
        let new_start = (old_start as i64 + shift).max(1);
        out.push_str(&format!(
            "@@ -{old_start},{} +{new_start},{news} @@\n",
            olds.len()
        ));
        for (c, t) in &body {
            out.push(char::from(*c));
            out.push_str(t);
            out.push('\n');
        }
        shift += news as i64 - olds.len() as i64;
        from = start + olds.len();
    }
    Ok(out)
}

fn header_name(line: &str, prefix: &str) -> Option<String> {
    let rest = line.strip_prefix(prefix)?;
    let name = rest.split('\t').next().unwrap_or(rest).trim_end();
    let name = name.trim_matches('"');
    (name != "/dev/null").then(|| name.to_string())
}

/// Splits a unified diff into per-file parts, counting hunk lines so that a deleted line that
/// itself starts with `--` is never mistaken for a file header.
fn split_patch(text: &str) -> Result<Vec<FilePatch>, String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut parts: Vec<FilePatch> = Vec::new();
    let mut i = 0;
    let hunk_re =
        regex::Regex::new(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@").map_err(|e| e.to_string())?;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("--- ") && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ ")) {
            let old_name = header_name(line_text(line), "--- ");
            let new_name = header_name(line_text(lines[i + 1]), "+++ ");
            let mut body = String::new();
            body.push_str(line);
            body.push_str(lines[i + 1]);
            if !lines[i + 1].ends_with('\n') {
                body.push('\n');
            }
            i += 2;
            let mut loose: Vec<Vec<String>> = Vec::new();
            // Whether a hunk with line ranges was read into `body`.
            let mut ranged = false;
            while let Some(line) = lines.get(i) {
                if hunk_re.is_match(line) {
                    if !loose.is_empty() {
                        return Err(
                            "a file's hunks mix `@@` headers with and without line ranges; give \
                             every hunk its ranges, or none"
                                .into(),
                        );
                    }
                } else if ranged {
                    // Ranged hunks took the lines their counts name: what follows (a blank
                    // line, a `format-patch` signature `-- `) is not this file's.
                    break;
                } else if line.starts_with("@@")
                    || (loose.is_empty()
                        && matches!(line.as_bytes().first(), Some(b' ' | b'-' | b'+'))
                        && !line.starts_with("--- "))
                {
                    // A hunk without ranges: a bare `@@` (its text after the second `@@` is a
                    // section name), or hunk lines right after the headers.
                    if line.starts_with("@@") {
                        i += 1;
                    }
                    let mut hunk = Vec::new();
                    while let Some(l) = lines.get(i) {
                        let next_file = l.starts_with("--- ")
                            && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ "));
                        if l.starts_with("@@") || next_file || !hunk_body_line(l) {
                            break;
                        }
                        hunk.push((*l).to_string());
                        i += 1;
                    }
                    // Blank lines after a hunk separate it from what follows; as empty
                    // context they would have to match the file.
                    while hunk.last().is_some_and(|l| line_text(l).is_empty()) {
                        hunk.pop();
                    }
                    loose.push(hunk);
                    continue;
                } else {
                    break;
                }
                let Some(caps) = hunk_re.captures(line) else {
                    break;
                };
                let count = |n: usize| {
                    caps.get(n)
                        .map_or(Ok(1), |m| m.as_str().parse::<usize>())
                        .map_err(|e| format!("bad hunk header {:?}: {e}", lines[i].trim_end()))
                };
                let (mut old_left, mut new_left) = (count(1)?, count(2)?);
                body.push_str(lines[i]);
                ranged = true;
                i += 1;
                while old_left > 0 || new_left > 0 {
                    let Some(l) = lines.get(i) else {
                        return Err(format!(
                            "the hunk for {} ends early: {old_left} old and {new_left} new line(s) \
                             missing",
                            new_name.as_deref().or(old_name.as_deref()).unwrap_or("?")
                        ));
                    };
                    match l.as_bytes().first() {
                        Some(b' ') => {
                            old_left = old_left.saturating_sub(1);
                            new_left = new_left.saturating_sub(1);
                        }
                        // An empty line inside a hunk is a context line whose space was stripped
                        // by an editor.
                        Some(b'\n') | Some(b'\r') => {
                            old_left = old_left.saturating_sub(1);
                            new_left = new_left.saturating_sub(1);
                            body.push(' ');
                        }
                        Some(b'-') => old_left = old_left.saturating_sub(1),
                        Some(b'+') => new_left = new_left.saturating_sub(1),
                        Some(b'\\') => {}
                        _ => {
                            return Err(format!(
                                "unexpected line {:?} inside a hunk (expected ' ', '-' or '+')",
                                l.trim_end()
                            ))
                        }
                    }
                    body.push_str(l);
                    i += 1;
                }
                if lines.get(i).is_some_and(|l| l.starts_with('\\')) {
                    body.push_str(lines[i]);
                    i += 1;
                }
            }
            if !loose.is_empty() && ranged {
                return Err(
                    "a file's hunks mix `@@` headers with and without line ranges; give every \
                     hunk its ranges, or none"
                        .into(),
                );
            }
            if loose.is_empty() && !ranged {
                return Err(format!(
                    "the patch for {} has headers but no hunk (`@@ -line,count +line,count @@` \
                     and its lines)",
                    new_name.as_deref().or(old_name.as_deref()).unwrap_or("?")
                ));
            }
            parts.push(FilePatch {
                old_name,
                new_name,
                text: body,
                loose,
            });
        } else {
            i += 1;
        }
    }
    if parts.is_empty() {
        return Err(
            "no file headers (`--- a/file` / `+++ b/file`) found; give a unified diff".into(),
        );
    }
    Ok(parts)
}

/// Drops git's `a/`/`b/` prefixes when both sides use them.
fn strip_git_prefixes(parts: &mut [FilePatch]) {
    let gitty = parts.iter().all(|p| {
        p.old_name.as_deref().is_none_or(|n| n.starts_with("a/"))
            && p.new_name.as_deref().is_none_or(|n| n.starts_with("b/"))
    });
    if gitty {
        for p in parts {
            p.old_name = p.old_name.take().map(|n| n[2..].to_string());
            p.new_name = p.new_name.take().map(|n| n[2..].to_string());
        }
    }
}

fn checked_name(name: &str) -> Result<&str, ToolError> {
    if name.is_empty() || name.contains('\0') {
        return Err(ToolError::new(
            crate::ToolErrorKind::PatchError,
            format!("the patch names an impossible file {name:?}"),
        ));
    }
    Ok(name)
}

fn patch_mode(text: &str, ctx: &ToolContext) -> Result<Value, ToolError> {
    let mut parts = split_patch(text).map_err(|e| {
        ToolError::new(
            crate::ToolErrorKind::PatchError,
            format!("the patch text cannot be parsed: {e}. Nothing was written"),
        )
    })?;
    strip_git_prefixes(&mut parts);
    if parts.len() > MAX_PATCH_FILES {
        return Err(ToolError::new(
            crate::ToolErrorKind::PatchError,
            format!(
                "the patch changes {} files; one call changes at most {MAX_PATCH_FILES}. Split it \
                 into several patches. Nothing was written",
                parts.len()
            ),
        ));
    }
    // Every file of the patch, from the first read to the last write (docs in file_lock).
    let named: Vec<PathBuf> = parts
        .iter()
        .filter_map(|p| p.new_name.as_deref().or(p.old_name.as_deref()))
        .map(|n| ctx.resolve(n))
        .collect();
    let _locked = super::file_lock::lock(&named);
    // Plan every change in memory first; write only when all of them apply.
    struct Planned {
        name: String,
        path: PathBuf,
        old: String,
        new: Option<String>,
        created: bool,
    }
    let mut plan: Vec<Planned> = Vec::new();
    let mut planned_paths = std::collections::HashSet::new();
    let mut planned_bytes = 0u64;
    for (n, part) in parts.iter().enumerate() {
        let name = checked_name(
            part.new_name
                .as_deref()
                .or(part.old_name.as_deref())
                .unwrap_or(""),
        )?
        .to_string();
        // The old text is read before the hunks are parsed: hunks without ranges are placed
        // by finding their lines in it.
        let path = ctx.resolve(&name);
        let old = if part.old_name.is_none() {
            let exists = match &ctx.paths {
                Some(policy) => policy.exists_for_write(&path)?,
                None => path.exists(),
            };
            if exists {
                return Err(ToolError::new(
                    crate::ToolErrorKind::PatchError,
                    format!("the patch creates {name}, which already exists. Nothing was written"),
                ));
            }
            String::new()
        } else {
            read_text(&path, ctx).map_err(|e| {
                ToolError::new(e.kind, format!("{}. Nothing was written", e.message))
            })?
        };
        let text = if part.loose.is_empty() {
            std::borrow::Cow::Borrowed(part.text.as_str())
        } else {
            std::borrow::Cow::Owned(format!(
                "{}{}",
                part.text,
                placed_hunks(&name, &old, &part.loose)?
            ))
        };
        let parsed = diffy::Patch::from_str(&text).map_err(|e| {
            ToolError::new(
                crate::ToolErrorKind::PatchError,
                format!(
                    "file #{} ({name}) of the patch: {e}. Nothing was written",
                    n + 1
                ),
            )
        })?;
        if !planned_paths.insert(path.clone()) {
            return Err(ToolError::new(
                crate::ToolErrorKind::PatchError,
                format!("the patch changes {name} twice; merge its hunks. Nothing was written"),
            ));
        }
        // A file with CRLF line ends and a diff written with LF ones (as models write them):
        // applied to the file's lines, and the result keeps the file's line ends.
        let crlf = old.contains("\r\n")
            && old.matches('\n').count() == old.matches("\r\n").count()
            && !text.contains("\r\n");
        let base = if crlf {
            std::borrow::Cow::Owned(old.replace("\r\n", "\n"))
        } else {
            std::borrow::Cow::Borrowed(old.as_str())
        };
        let new = diffy::apply(&base, &parsed).map_err(|e| {
            ToolError::new(
                crate::ToolErrorKind::PatchError,
                format!(
                    "{name}: {e} — its context or removed lines do not match the file. Read the \
                     file again and regenerate the diff. Nothing was written"
                ),
            )
        })?;
        let new = if crlf { new.replace('\n', "\r\n") } else { new };
        let new = if part.new_name.is_none() {
            if !new.is_empty() {
                return Err(ToolError::new(
                    crate::ToolErrorKind::PatchError,
                    format!("the patch deletes {name} but does not remove all of its lines. Nothing was written"),
                ));
            }
            None
        } else {
            Some(new)
        };
        planned_bytes += (old.len() + new.as_ref().map_or(0, String::len)) as u64;
        if planned_bytes > MAX_PATCH_PLAN_BYTES {
            return Err(ToolError::new(
                crate::ToolErrorKind::FileTooLarge,
                format!(
                    "the patch's files come to more than {MAX_PATCH_PLAN_BYTES} bytes before and \
                     after the change (at file #{} ({name})); split it into several patches. \
                     Nothing was written",
                    n + 1
                ),
            ));
        }
        plan.push(Planned {
            name,
            path,
            old,
            new,
            created: part.old_name.is_none(),
        });
    }
    // The dirs the created files' writes will make, to remove again if a later file fails.
    let made_dirs: Vec<PathBuf> = plan
        .iter()
        .filter(|p| p.created)
        .flat_map(|p| missing_dirs(&p.path, &ctx.cwd))
        .collect();
    // A write can still fail where planning could not tell (a write refused because of what an
    // earlier file of the patch made, a full disk): the files written before it are put back.
    for (i, p) in plan.iter().enumerate() {
        let applied = match &p.new {
            Some(content) => atomic_write(&p.path, content, ctx),
            None => remove_planned(&p.path, ctx),
        };
        if let Err(e) = applied {
            let mut not_undone = Vec::new();
            for done in plan[..i].iter().rev() {
                let undone = match (&done.new, done.created) {
                    (Some(_), true) => remove_planned(&done.path, ctx),
                    _ => write_now(&done.path, &done.old, ctx),
                };
                if undone.is_err() {
                    not_undone.push(done.name.as_str());
                }
            }
            for dir in made_dirs.iter().rev() {
                let _ = match &ctx.paths {
                    Some(policy) => policy.remove_empty_dir(dir),
                    None => std::fs::remove_dir(dir).map_err(|e| ToolError::io(dir, &e)),
                };
            }
            let undo = if i == 0 {
                "Nothing was written".to_string()
            } else if not_undone.is_empty() {
                "The files written before it were put back as they were: nothing was changed"
                    .to_string()
            } else {
                format!(
                    "The files written before it were put back, except {}",
                    not_undone.join(", ")
                )
            };
            return Err(ToolError::new(
                e.kind,
                format!("{}: {}. {undo}", p.name, e.message.trim_end_matches('.')),
            ));
        }
    }
    let mut files = Vec::new();
    let mut diffs = String::new();
    for p in &plan {
        let change = match (&p.new, p.created) {
            (None, _) => Change::Deleted,
            (Some(_), true) => Change::Created,
            (Some(_), false) => Change::Modified,
        };
        diffs.push_str(&diff(
            &p.name,
            &p.old,
            p.new.as_deref().unwrap_or(""),
            change,
        ));
        files.push(json!({
            "path": p.name,
            "action": match change {
                Change::Deleted => "deleted",
                Change::Created => "created",
                Change::Modified => "modified",
            },
        }));
    }
    Ok(json!({"files": files, "diff": diffs}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(cwd: &Path, args: Value) -> Result<Value, ToolError> {
        patch(args.as_object().unwrap(), &ToolContext::agent(cwd))
    }

    #[test]
    fn arguments_of_the_other_mode_are_refused_and_nothing_is_edited() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f.txt"), "a\n").unwrap();
        let diff = "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a\n+b\n";
        let e = call(d.path(), json!({"path": "f.txt", "patch": diff})).unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::InvalidArguments, "{e:?}");
        assert!(
            e.message
                .starts_with("argument `patch` belongs to mode=\"patch\", not to mode=\"replace\""),
            "{e:?}"
        );
        let e = call(
            d.path(),
            json!({"mode": "patch", "patch": diff, "old_string": "x", "replace_all": true}),
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("arguments `old_string`, `replace_all` belong to mode=\"replace\""),
            "{e:?}"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("f.txt")).unwrap(),
            "a\n"
        );
        // Each mode with its own arguments still works.
        call(d.path(), json!({"mode": "patch", "patch": diff})).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("f.txt")).unwrap(),
            "b\n"
        );
    }

    #[test]
    fn devices_and_fifos_are_refused_without_reading_them() {
        use std::os::unix::fs::FileTypeExt;
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // /dev/zero never ends (it used to be read until memory ran out), a FIFO without a
        // writer would hold the open, /dev/null would be replaced by a regular file.
        for path in ["/dev/zero", "/dev/null", "pipe"] {
            let e = call(
                d.path(),
                json!({"mode": "replace", "path": path, "old_string": "a", "new_string": "b"}),
            )
            .unwrap_err();
            assert_eq!(
                e.kind,
                crate::ToolErrorKind::NotARegularFile,
                "{path}: {e:?}"
            );
        }
        // A unified diff that updates or deletes one (`/dev/null` there means "no file").
        for (path, to) in [
            ("/dev/zero", "/dev/zero"),
            ("pipe", "pipe"),
            ("pipe", "/dev/null"),
        ] {
            let hunk = if to == "/dev/null" {
                "@@ -1 +0,0 @@\n-a\n"
            } else {
                "@@ -1 +1 @@\n-a\n+b\n"
            };
            let e = call(
                d.path(),
                json!({"mode": "patch", "patch": format!("--- {path}\n+++ {to}\n{hunk}")}),
            )
            .unwrap_err();
            assert_eq!(
                e.kind,
                crate::ToolErrorKind::NotARegularFile,
                "{path}: {e:?}"
            );
        }
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn occurrences_are_found_in_linear_time_as_the_windows_found_them() {
        let naive = |hay: &[u8], want: &[u8], overlapping: bool| {
            let mut hits = Vec::new();
            let mut i = 0;
            while i + want.len() <= hay.len() {
                if hay[i..i + want.len()] == *want {
                    hits.push(i);
                    i += if overlapping { 1 } else { want.len() };
                } else {
                    i += 1;
                }
            }
            hits
        };
        for (hay, want) in [
            ("aaaaa", "aa"),
            ("abababab", "abab"),
            ("abcabcabd", "abcabd"),
            ("xyz", "xyzw"),
            ("aabaabaaab", "aab"),
            ("", "a"),
        ] {
            for overlapping in [false, true] {
                assert_eq!(
                    occurrences(hay.as_bytes(), want.as_bytes(), overlapping),
                    naive(hay.as_bytes(), want.as_bytes(), overlapping),
                    "{hay} / {want} / {overlapping}"
                );
            }
        }
        // The probe's case, at a size the windows needed 10^10 comparisons for (minutes).
        let hay = vec!["x = 1"; 200_000];
        let mut want = vec!["x = 1"; 49_999];
        want.push("x = 2");
        assert!(occurrences(&hay, &want, false).is_empty());
        want.pop();
        assert_eq!(
            occurrences(&hay, &want, false),
            [0, 49_999, 99_998, 149_997]
        );
    }

    #[test]
    fn exact_then_whitespace_tolerant_replace() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.py");
        std::fs::write(&f, "def f():\n    if x:\n        return 1\n    return 2\n").unwrap();
        let r = call(
            d.path(),
            json!({"path": "a.py", "old_string": "return 2", "new_string": "return 3"}),
        )
        .unwrap();
        assert_eq!(r["match"], "exact");
        assert!(r["diff"].as_str().unwrap().contains("+    return 3"));
        // Indented differently and with extra blanks: found, and re-indented to the file's level.
        let r = call(d.path(), json!({"path": "a.py", "old_string": "if  x:\n    return 1", "new_string": "if x:\n    return 10\nelse:\n    pass"})).unwrap();
        assert_eq!(r["match"], "whitespace-tolerant");
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "def f():\n    if x:\n        return 10\n    else:\n        pass\n    return 3\n"
        );
    }

    #[test]
    fn an_edit_whose_result_would_be_too_large_is_refused_before_it_is_built() {
        let d = tempfile::tempdir().unwrap();
        // Stop 59's probe: each `a` of a 1 MiB file replaced by 3,000 bytes took the
        // supervisor past 2.8 GB before the write failed.
        let big = "a".repeat(1 << 20);
        std::fs::write(d.path().join("a.txt"), &big).unwrap();
        let e = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "a", "new_string": "b".repeat(3000),
                   "replace_all": true}),
        )
        .unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::FileTooLarge, "{e:?}");
        assert!(e.message.contains("nothing was changed"), "{e:?}");
        // The whitespace-tolerant match grows its result line by line, and stops as well.
        let lines = "x\n".repeat(100_000);
        std::fs::write(d.path().join("l.txt"), &lines).unwrap();
        let e = call(
            d.path(),
            json!({"path": "l.txt", "old_string": "x  ", "new_string": "y".repeat(400),
                   "replace_all": true}),
        )
        .unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::FileTooLarge, "{e:?}");
        assert_eq!(
            std::fs::read_to_string(d.path().join("a.txt")).unwrap(),
            big
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("l.txt")).unwrap(),
            lines
        );
        // Within the limit it is done.
        let r = call(
            d.path(),
            json!({"path": "l.txt", "old_string": "x  ", "new_string": "yy",
                   "replace_all": true}),
        )
        .unwrap();
        assert_eq!(r["replacements"], 100_000);
        // A change that large gets its size, not a diff (which took over ten minutes).
        let diff = r["diff"].as_str().unwrap();
        assert!(
            diff.starts_with("(no diff for l.txt: the change spans 100000 old"),
            "{diff}"
        );
    }

    #[test]
    fn a_patch_of_too_many_files_is_refused_and_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let many = |n: usize| -> String {
            (0..n)
                .map(|i| format!("--- /dev/null\n+++ b/m/f{i}\n@@ -0,0 +1 @@\n+x\n"))
                .collect()
        };
        let e = call(
            d.path(),
            json!({"mode": "patch", "patch": many(MAX_PATCH_FILES + 1)}),
        )
        .unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::PatchError, "{e:?}");
        assert!(e.message.contains("at most 1000"), "{e:?}");
        assert!(!d.path().join("m").exists());
        let r = call(
            d.path(),
            json!({"mode": "patch", "patch": many(MAX_PATCH_FILES)}),
        )
        .unwrap();
        assert_eq!(r["files"].as_array().map(Vec::len), Some(MAX_PATCH_FILES));
    }

    #[test]
    fn a_whitespace_tolerant_replace_takes_the_file_s_tabs_and_indent_width() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("tabs.py");
        std::fs::write(&f, "def f():\n\tx = 1\n\tif x:\n\t\treturn x\n\treturn 0\n").unwrap();
        let r = call(
            d.path(),
            json!({"path": "tabs.py",
                   "old_string": "def f():\n    x = 1\n    if x:\n        return x",
                   "new_string": "def f():\n    x = 2\n    if x:\n        if x > 1:\n            return x + 1"}),
        )
        .unwrap();
        assert_eq!(r["match"], "whitespace-tolerant");
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "def f():\n\tx = 2\n\tif x:\n\t\tif x > 1:\n\t\t\treturn x + 1\n\treturn 0\n"
        );
        // Two-space old text against a four-space file.
        let f = d.path().join("wide.py");
        std::fs::write(&f, "class A:\n    def m(self):\n        return 1\n").unwrap();
        call(
            d.path(),
            json!({"path": "wide.py",
                   "old_string": "def m(self):\n  return 1",
                   "new_string": "def m(self):\n  y = 2\n  return y"}),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "class A:\n    def m(self):\n        y = 2\n        return y\n"
        );
    }

    #[test]
    fn hunks_without_ranges_are_placed_by_their_lines_or_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("bare.txt");
        std::fs::write(&f, "a\nb\nc\nd\nb\n").unwrap();
        // A bare `@@` (models write it so), then hunk lines straight after the headers.
        for (n, hunk) in ["@@\n a\n-b\n+B\n c\n", " c\n-d\n+D\n"].iter().enumerate() {
            let r = call(
                d.path(),
                json!({"mode": "patch", "patch": format!("--- a/bare.txt\n+++ b/bare.txt\n{hunk}")}),
            )
            .unwrap_or_else(|e| panic!("{n}: {e:?}"));
            assert_eq!(r["files"][0]["action"], "modified", "{r}");
        }
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a\nB\nc\nD\nb\n");
        // Two hunks of one file, in order, with a section name after the `@@`.
        let r = call(
            d.path(),
            json!({"mode": "patch", "patch": "--- bare.txt\n+++ bare.txt\n@@ top\n-a\n+A\n@@\n D\n-b\n+bb\n"}),
        );
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "A\nB\nc\nD\nbb\n");
        for (patch, why) in [
            ("--- bare.txt\n+++ bare.txt\n", "no hunk"),
            (
                "--- bare.txt\n+++ bare.txt\n@@ @@\n",
                "no context or removed lines",
            ),
            (
                "--- bare.txt\n+++ bare.txt\n@@\n-zzz\n+y\n",
                "are not in the file",
            ),
            (
                "--- bare.txt\n+++ bare.txt\n@@\n c\n+x\n c\n",
                "are not in the file",
            ),
        ] {
            let e = call(d.path(), json!({"mode": "patch", "patch": patch})).unwrap_err();
            assert_eq!(e.kind, "PatchError", "{patch:?}: {e:?}");
            assert!(e.message.contains(why), "{patch:?}: {}", e.message);
        }
        std::fs::write(&f, "x\ny\nx\ny\n").unwrap();
        let e = call(
            d.path(),
            json!({"mode": "patch", "patch": "--- bare.txt\n+++ bare.txt\n@@\n x\n-y\n+z\n"}),
        )
        .unwrap_err();
        assert!(e.message.contains("occur 2 times"), "{}", e.message);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "x\ny\nx\ny\n");
    }

    #[test]
    fn lines_after_a_ranged_hunk_are_not_a_hunk_of_their_own() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        for tail in ["\n", "\n\n", "-- \n2.43.0\n\n"] {
            std::fs::write(&f, "a\n").unwrap();
            let r = call(
                d.path(),
                json!({"mode": "patch", "patch": format!("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n{tail}")}),
            );
            assert!(r.is_ok(), "{tail:?}: {r:?}");
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "b\n", "{tail:?}");
        }
        // Nor after a rangeless one: a blank line ends it.
        std::fs::write(&f, "a\nb\n").unwrap();
        let r = call(
            d.path(),
            json!({"mode": "patch", "patch": "--- a/f\n+++ b/f\n@@\n a\n-b\n+c\n\n"}),
        );
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a\nc\n");
    }

    #[test]
    fn an_lf_diff_applies_to_a_crlf_file_and_keeps_its_line_ends() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("pc.txt");
        std::fs::write(&f, "one\r\ntwo\r\nthree\r\n").unwrap();
        call(
            d.path(),
            json!({"mode": "patch", "patch": "--- a/pc.txt\n+++ b/pc.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"}),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "one\r\nTWO\r\nthree\r\n"
        );
    }

    #[test]
    fn ambiguous_and_missing_matches_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.txt");
        std::fs::write(&f, "x = 1\nx = 1\n").unwrap();
        let e = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "x = 1", "new_string": "y"}),
        )
        .unwrap_err();
        assert_eq!(e.kind, "AmbiguousMatch");
        let e = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "x  =  1", "new_string": "y"}),
        )
        .unwrap_err();
        assert_eq!(e.kind, "AmbiguousMatch");
        let e = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "zzz", "new_string": "y"}),
        )
        .unwrap_err();
        assert_eq!(e.kind, "NoMatch");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "x = 1\nx = 1\n");
        let r = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "x = 1", "new_string": "y", "replace_all": true}),
        )
        .unwrap();
        assert_eq!(r["replacements"], 2);
        std::fs::write(&f, b"caf\xe9\n").unwrap();
        let e = call(
            d.path(),
            json!({"path": "a.txt", "old_string": "caf", "new_string": "y"}),
        )
        .unwrap_err();
        assert_eq!(e.kind, "NotUtf8");
    }

    #[test]
    fn multi_file_patch_applies_all_or_nothing() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("one.txt"), "a\nb\nc\n").unwrap();
        std::fs::write(d.path().join("two.txt"), "-- sql comment\nkeep\n").unwrap();
        let good = "diff --git a/one.txt b/one.txt\n--- a/one.txt\n+++ b/one.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\
                    --- a/two.txt\n+++ b/two.txt\n@@ -1,2 +1,1 @@\n--- sql comment\n keep\n\
                    --- /dev/null\n+++ b/new/three.txt\n@@ -0,0 +1,1 @@\n+hello\n";
        let r = call(d.path(), json!({"mode": "patch", "patch": good})).unwrap();
        assert_eq!(r["files"].as_array().unwrap().len(), 3);
        assert_eq!(
            std::fs::read_to_string(d.path().join("one.txt")).unwrap(),
            "a\nB\nc\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("two.txt")).unwrap(),
            "keep\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("new/three.txt")).unwrap(),
            "hello\n"
        );
        let bad = "--- a/one.txt\n+++ b/one.txt\n@@ -1,1 +1,1 @@\n-a\n+A\n--- a/two.txt\n+++ b/two.txt\n@@ -1,1 +1,1 @@\n-nope\n+x\n";
        let e = call(d.path(), json!({"mode": "patch", "patch": bad})).unwrap_err();
        assert_eq!(e.kind, "PatchError");
        assert!(e.message.contains("two.txt") && e.message.contains("Nothing was written"));
        assert_eq!(
            std::fs::read_to_string(d.path().join("one.txt")).unwrap(),
            "a\nB\nc\n"
        );
        let e = call(
            d.path(),
            json!({"mode": "patch", "patch": "just some text"}),
        )
        .unwrap_err();
        assert_eq!(e.kind, "PatchError");
    }

    #[test]
    fn a_write_refused_midway_puts_back_what_the_patch_wrote_before_it() {
        use crate::path_policy::{PathPolicy, RootAccess};
        let d = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(d.path()).unwrap();
        std::fs::write(cwd.join("keep.txt"), "one\n").unwrap();
        let mut policy = PathPolicy::new();
        policy.add_root(&cwd, RootAccess::ReadWrite, false).unwrap();
        let mut ctx = ToolContext::agent(&cwd);
        ctx.paths = Some(std::sync::Arc::new(policy));
        // Each file alone is fine; the third is refused only once the second exists (a bare
        // repository made by the patch itself), which planning cannot see.
        let text = "--- a/keep.txt\n+++ b/keep.txt\n@@ -1 +1 @@\n-one\n+two\n\
                    --- /dev/null\n+++ b/deep/gd/HEAD\n@@ -0,0 +1 @@\n+ref: refs/heads/main\n\
                    --- /dev/null\n+++ b/deep/gd/objects/x\n@@ -0,0 +1 @@\n+x\n";
        let e = patch(
            json!({"mode": "patch", "patch": text}).as_object().unwrap(),
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e:?}");
        assert!(e.message.contains("put back"), "{e:?}");
        assert_eq!(
            std::fs::read_to_string(cwd.join("keep.txt")).unwrap(),
            "one\n"
        );
        assert!(!cwd.join("deep").exists(), "the dirs it made are left");
        // A `..` above the root is refused before any level is made.
        let e = patch(
            json!({"mode": "patch", "patch": "--- /dev/null\n+++ b/k/k/../../../x\n@@ -0,0 +1 @@\n+x\n"})
                .as_object()
                .unwrap(),
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e:?}");
        assert!(!cwd.join("k").exists());
    }

    #[test]
    fn the_returned_diff_applied_elsewhere_makes_the_same_change() {
        // Created and deleted files are labelled /dev/null, as git labels them: given the
        // returned diff, a tool creates and deletes them rather than leaving empty files.
        let start = |d: &Path| {
            std::fs::write(d.join("kept.txt"), "a\n\nb\n").unwrap();
            std::fs::write(d.join("gone.txt"), "x\ny\n").unwrap();
        };
        let first = tempfile::tempdir().unwrap();
        start(first.path());
        let change = "--- a/kept.txt\n+++ b/kept.txt\n@@ -1,3 +1,3 @@\n a\n \n-b\n+B\n\
                      --- a/gone.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n\
                      --- /dev/null\n+++ b/made.txt\n@@ -0,0 +1,1 @@\n+new\n";
        let r = call(first.path(), json!({"mode": "patch", "patch": change})).unwrap();
        let returned = r["diff"].as_str().unwrap();
        assert!(
            returned.contains("--- a/gone.txt\n+++ /dev/null\n"),
            "{returned}"
        );
        assert!(
            returned.contains("--- /dev/null\n+++ b/made.txt\n"),
            "{returned}"
        );
        let second = tempfile::tempdir().unwrap();
        start(second.path());
        call(second.path(), json!({"mode": "patch", "patch": returned})).unwrap();
        for d in [first.path(), second.path()] {
            assert_eq!(
                std::fs::read_to_string(d.join("kept.txt")).unwrap(),
                "a\n\nB\n"
            );
            assert_eq!(
                std::fs::read_to_string(d.join("made.txt")).unwrap(),
                "new\n"
            );
            assert!(!d.join("gone.txt").exists());
        }
    }

    #[test]
    fn an_absolute_path_is_labelled_as_given_and_the_diff_applies_again() {
        // A probe of stop 54: `+++ b//tmp/…/abs.txt` named no file any tool would apply.
        let cwd = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let abs = outside.path().join("abs.txt");
        let change = format!(
            "--- /dev/null\n+++ {}\n@@ -0,0 +1,1 @@\n+abs\n",
            abs.display()
        );
        let r = call(cwd.path(), json!({"mode": "patch", "patch": change})).unwrap();
        let returned = r["diff"].as_str().unwrap().to_string();
        assert!(
            returned.starts_with(&format!("--- /dev/null\n+++ {}\n", abs.display())),
            "{returned}"
        );
        std::fs::remove_file(&abs).unwrap();
        call(cwd.path(), json!({"mode": "patch", "patch": returned})).unwrap();
        assert_eq!(std::fs::read_to_string(&abs).unwrap(), "abs\n");
    }

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<PatchArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to edit (mode=replace)"},
                    "old_string": {"type": "string", "description": "Text to find (mode=replace); include enough context to be unique"},
                    "new_string": {"type": "string", "description": "Replacement text (mode=replace)"},
                    "replace_all": {"type": "boolean", "default": false, "description": "Replace every match instead of refusing when there are several"},
                    "mode": {"type": "string", "enum": ["replace", "patch"], "default": "replace"},
                    "patch": {"type": "string", "description": "Unified diff text (mode=patch)"}
                }
            }),
            json!({"path": "app.py", "old_string": "x = 1", "new_string": "x = 2"}),
            json!({"mode": "rewrite"}),
        );
    }
}
