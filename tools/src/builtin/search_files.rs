//! `search_files`: regex search over file contents, or file-name search, built on ripgrep's own
//! crates (`ignore` for the walk — .gitignore/.ignore respected, hidden files skipped — and
//! `grep-searcher`/`grep-regex` for the search, which skips binary files).
//!
//! Paging is exact and memory stays bounded however many matches there are: a first, parallel
//! pass only counts matching lines per file; the files are then sorted by path (so pages are
//! stable between calls) and a second pass re-reads just the files that cover the requested page.
//!
//! Result shapes (all carry `total`, `offset`, `limit`, `truncated`, `next_offset`):
//! - `target="content"`, `output_mode="content"`: `matches` = `[{path, line, content}]` (plus
//!   `context_before`/`context_after` when `context > 0`); `total` counts matching lines.
//! - `output_mode="files_with_matches"`: `files` = paths with at least one match.
//! - `output_mode="count"`: `counts` = `[{path, count}]`, paged by file: `total` counts
//!   files, `total_matches` matching lines.
//! - `target="files"`: `pattern` is a glob on file names; `files` = matching paths (with
//!   `output_mode="count"`, no list: `total` alone).
//!
//! Paths are relative to the working directory when the searched path was relative, so they can
//! be passed straight to `read_file`.

use super::args::{check_path, in_range, parse, schema_for};
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{
    BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};
use ignore::{WalkBuilder, WalkState};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Longest pattern accepted.
const MAX_PATTERN_BYTES: usize = 8 * 1024;
/// Longest line content returned; longer lines are cut with a marker.
const MAX_LINE_CHARS: usize = 500;
/// Most results in one page.
const MAX_LIMIT: i64 = 1000;
/// Largest compiled regex (and lazy DFA cache) one search may build, in bytes. The heap a
/// search takes before its pattern is refused grows with this limit: at 50 MiB a pattern such
/// as `(\w{100}){400}` took ~69 MB before failing, per call (measured: 16 MB at 8 MiB).
/// 8 MiB still holds what a search is for: a Unicode `\w{100}` compiles (it needs more than
/// 4 MiB), `\w{50}` needs under 4 MiB, an alternation of 1,000 identifiers under 0.5 MiB; the
/// DFA cache only bounds what is kept, not what a search can find (the engine falls back when
/// it fills). docs/strict-mode.md has the measurements.
const REGEX_SIZE_LIMIT: usize = 8 << 20;
/// Most searches one execution runs at once; its further calls wait for a slot. Each one
/// holds a compiled regex (up to [`REGEX_SIZE_LIMIT`] twice over) and a walker's threads, and
/// a script with 40 threads calling search_files at once took a supervisor to 1.87 GB. The
/// slots are an execution's own (the agent's direct calls share one set): a process-wide set
/// let one script's slow searches make every other execution's wait.
const MAX_CONCURRENT_SEARCHES: usize = 4;

/// The searches running now per execution (keyed by [`scope_key`]; no entry: none) and the
/// wake-up of those waiting for a slot.
static RUNNING: (std::sync::Mutex<Vec<(usize, usize)>>, std::sync::Condvar) =
    (std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new());

/// Which execution a call belongs to, for its slots: the address of its environment, which
/// stays one execution's while the call holds it (`0`: an agent's direct call).
fn scope_key(ctx: &ToolContext) -> usize {
    ctx.env
        .as_ref()
        .map_or(0, |env| std::sync::Arc::as_ptr(env) as usize)
}

/// The most searches seen running at once (tests only: the bound's witness).
#[cfg(test)]
static PEAK_RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of an execution's [`MAX_CONCURRENT_SEARCHES`] slots, given back when dropped.
struct SearchSlot {
    key: usize,
}

/// How many searches the execution `key` runs now, in `running`.
fn running_of(running: &[(usize, usize)], key: usize) -> usize {
    running
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, n)| *n)
}

impl SearchSlot {
    /// Waits for a free slot of the execution `key`; gives up (`None`) when the call's
    /// execution ends first, so a call nobody waits for does not take a slot from a live one.
    fn acquire(key: usize, ended: &crate::call_scope::EndedFlag) -> Option<SearchSlot> {
        let (count, freed) = &RUNNING;
        // A poisoned lock only means a search panicked while counting; the counts are still
        // whole (each is changed in one statement), so the guard is taken back.
        let mut running = count.lock().unwrap_or_else(|p| p.into_inner());
        while running_of(&running, key) >= MAX_CONCURRENT_SEARCHES {
            if ended.is_set() {
                return None;
            }
            running = freed
                .wait_timeout(running, std::time::Duration::from_millis(100))
                .map(|(guard, _)| guard)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        match running.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => running.push((key, 1)),
        }
        #[cfg(test)]
        PEAK_RUNNING.fetch_max(
            running_of(&running, key),
            std::sync::atomic::Ordering::SeqCst,
        );
        Some(SearchSlot { key })
    }
}

impl Drop for SearchSlot {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        let mut running = count.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = running.iter_mut().find(|(k, _)| *k == self.key) {
            *n = n.saturating_sub(1);
        }
        running.retain(|(_, n)| *n > 0);
        // Every waiter: the one woken must be of this execution to take the slot.
        freed.notify_all();
    }
}

/// The arguments of `search_files`: its schema and its parser.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchFilesArgs {
    /// Regex (content search) or glob such as *.py (target="files")
    pattern: String,
    #[serde(default)]
    target: Target,
    /// Directory or file to search
    #[serde(default = "dot")]
    path: String,
    /// Only files whose name (or, with a /, relative path) matches this glob, e.g. *.yaml
    file_glob: Option<String>,
    #[serde(default = "default_limit")]
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: i64,
    /// Results to skip (use next_offset)
    #[serde(default)]
    #[schemars(range(min = 0))]
    offset: i64,
    #[serde(default)]
    output_mode: OutputMode,
    /// Lines of context around each match
    #[serde(default)]
    #[schemars(range(min = 0, max = 20))]
    context: i64,
    /// Also search hidden files and directories (names starting with a dot); .git is never searched
    #[serde(default)]
    hidden: bool,
}

// `target`: search contents or file names. (No doc comment: it would become the schema's
// description of the argument, which the tool has never had.)
#[derive(Deserialize, Serialize, schemars::JsonSchema, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Target {
    #[default]
    Content,
    Files,
}

// `output_mode` of a content search (no doc comment, as for `Target`).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum OutputMode {
    #[default]
    Content,
    FilesWithMatches,
    Count,
}

fn dot() -> String {
    ".".into()
}

fn default_limit() -> i64 {
    50
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "search_files",
        "file",
        "Search file contents with a regex (target=\"content\", default) or find files by name \
         glob (target=\"files\"). Respects .gitignore, skips binary files and (unless hidden=true) \
         hidden ones, pages results. \
         Content results: matches=[{path, line, content}]; files mode: files=[path]; always total, \
         truncated, next_offset.",
        schema_for::<SearchFilesArgs>(),
        search_files,
    )
    .with_emoji("🔎")
    .with_parallel_safe(true)
}

inventory::submit! { BuiltinTool(entry) }

/// Counts matching lines; `.1` is set when the file turned out binary, which leaves it out
/// whole (a NUL found past the first buffer came after matches already counted: the file was
/// half counted, its `total` short, instead of skipped as binary files are).
struct CountSink(u64, bool);

impl CountSink {
    fn new() -> Self {
        CountSink(0, false)
    }

    /// The file's count, `None` when it has no match or is binary.
    fn count(&self) -> Option<u64> {
        (self.0 > 0 && !self.1).then_some(self.0)
    }
}

impl Sink for CountSink {
    type Error = std::io::Error;
    fn matched(&mut self, _: &Searcher, _: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        self.0 += 1;
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, std::io::Error> {
        self.1 = true;
        Ok(false)
    }
}

/// Collects the matches (and context) of one file that fall in the page.
struct PageSink<'a> {
    path: &'a str,
    /// Matching lines of this file to skip before the page starts.
    skip: u64,
    /// Matches still wanted.
    want: u64,
    seen: u64,
    pending_before: Vec<String>,
    out: Vec<Value>,
    with_context: bool,
}

fn line_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches(['\n', '\r']);
    match text.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => format!("{} … [line cut: {} bytes]", &text[..cut], text.len()),
        None => text.to_string(),
    }
}

impl Sink for PageSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, m: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        self.seen += 1;
        if self.seen <= self.skip {
            self.pending_before.clear();
            return Ok(true);
        }
        if self.out.len() as u64 >= self.want {
            return Ok(false);
        }
        let mut v = json!({
            "path": self.path,
            "line": m.line_number().unwrap_or(0),
            "content": line_text(m.bytes()),
        });
        if self.with_context {
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "context_before".into(),
                    Value::from(std::mem::take(&mut self.pending_before)),
                );
                o.insert("context_after".into(), Value::Array(Vec::new()));
            }
        }
        self.out.push(v);
        Ok(true)
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, std::io::Error> {
        let text = line_text(c.bytes());
        match c.kind() {
            SinkContextKind::Before => self.pending_before.push(text),
            SinkContextKind::After => {
                if self.seen > self.skip {
                    if let Some(Value::Array(after)) =
                        self.out.last_mut().and_then(|m| m.get_mut("context_after"))
                    {
                        after.push(Value::String(text));
                    }
                }
            }
            SinkContextKind::Other => {}
        }
        // Once the page is full, stop after the last match's trailing context.
        Ok(true)
    }
}

struct Walk {
    root: PathBuf,
    /// Prefix stripped from reported paths (the cwd when the search path was relative).
    display_base: Option<PathBuf>,
    file_glob: Option<(globset::GlobMatcher, bool)>,
    /// Whether hidden files and directories are walked too (`.git` never is).
    hidden: bool,
    /// Strict mode: every file is re-resolved beneath an allowed root before it is reported
    /// or read, so a directory swapped for a symlink mid-walk leads nowhere.
    policy: Option<std::sync::Arc<crate::path_policy::PathPolicy>>,
    /// Set when the script's execution ends: the walk stops (a search of a large tree would
    /// otherwise keep a core busy for the executions after it, for a reply nobody reads).
    ended: crate::call_scope::EndedFlag,
}

impl Walk {
    fn display(&self, p: &Path) -> String {
        match &self.display_base {
            Some(base) => match p.strip_prefix(base) {
                Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
                Ok(rel) => rel.to_string_lossy().into_owned(),
                Err(_) => p.to_string_lossy().into_owned(),
            },
            None => p.to_string_lossy().into_owned(),
        }
    }

    fn glob_ok(&self, p: &Path) -> bool {
        match &self.file_glob {
            None => true,
            Some((g, true)) => p
                .strip_prefix(&self.root)
                .map(|rel| g.is_match(rel))
                .unwrap_or(false),
            Some((g, false)) => p.file_name().is_some_and(|n| g.is_match(n)),
        }
    }

    /// Visits every file (in parallel); `f` returns a value to keep.
    fn files<T: Send>(&self, f: impl Fn(&Path) -> Option<T> + Sync) -> Vec<(PathBuf, T)> {
        let found: Mutex<Vec<(PathBuf, T)>> = Mutex::new(Vec::new());
        let mut builder = WalkBuilder::new(&self.root);
        builder
            .require_git(false)
            .follow_links(false)
            .hidden(!self.hidden);
        if self.policy.is_some() {
            // Ignore files are read by path (and the global one lives outside every root): in
            // strict mode none is read, so none can be a link to something outside.
            builder
                .ignore(false)
                .git_ignore(false)
                .git_global(false)
                .git_exclude(false)
                .parents(false);
        }
        // A kernel pseudo-filesystem met on the way (`/proc`, `/sys` under `path="/"`) is not
        // walked: its files do not end (`/proc/kcore`) or wait for data (`/proc/kmsg`), and a
        // search has no business in them.
        // A repository's own store is not the project's files: with hidden files walked too,
        // `.git` would fill every page with packed objects and refs (as `rg --hidden` does).
        builder.filter_entry(|e| {
            !(e.depth() > 0
                && e.file_type().is_some_and(|t| t.is_dir())
                && (e.file_name() == ".git" || on_kernel_pseudo_fs(e.path())))
        });
        builder.build_parallel().run(|| {
            Box::new(|entry| {
                if self.ended.is_set() {
                    return WalkState::Quit;
                }
                let Ok(entry) = entry else {
                    return WalkState::Continue;
                };
                if !entry.file_type().is_some_and(|t| t.is_file()) {
                    return WalkState::Continue;
                }
                let p = entry.path();
                if !self.glob_ok(p) {
                    return WalkState::Continue;
                }
                if let Some(policy) = &self.policy {
                    if !policy.check_read(p).is_ok_and(|m| m.is_file()) {
                        return WalkState::Continue;
                    }
                }
                if let Some(v) = f(p) {
                    if let Ok(mut g) = found.lock() {
                        g.push((p.to_path_buf(), v));
                    }
                }
                WalkState::Continue
            })
        });
        let mut found = found.into_inner().unwrap_or_else(|e| e.into_inner());
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }
}

impl Walk {
    /// Searches one file: by path, or in strict mode from a descriptor opened beneath an
    /// allowed root.
    fn search<S: Sink>(
        &self,
        searcher: &mut Searcher,
        matcher: &RegexMatcher,
        p: &Path,
        sink: S,
    ) -> Result<(), S::Error> {
        match &self.policy {
            // Non-blocking, as every file tool opens: a regular file of /proc or /sys can wait
            // for data forever (`/proc/kmsg`), holding a supervisor thread past the script's
            // end and the CLI's exit (`search_files(path="/")`). It now reads what is there.
            None => match super::file_open::open_nonblocking(p) {
                Ok(file) => searcher.search_file(matcher, &file, sink),
                Err(e) => Err(grep_searcher::SinkError::error_io(e)),
            },
            Some(policy) => match policy.open_read(p) {
                Ok(file) => searcher.search_file(matcher, &file, sink),
                Err(e) => Err(grep_searcher::SinkError::error_io(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    e.message,
                ))),
            },
        }
    }
}

/// Whether `dir` is on a filesystem the kernel makes up (proc, sysfs, debugfs, tracefs,
/// securityfs, cgroup, configfs, bpf, pstore, efivarfs).
fn on_kernel_pseudo_fs(dir: &Path) -> bool {
    const PSEUDO: [i64; 11] = [
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0x7363_6673, // securityfs
        0x0027_e0eb, // cgroup
        0x6367_7270, // cgroup2
        0x6265_6570, // configfs
        0xcafe_4a11, // bpf
        0x6165_676c, // pstore
        0xde5e_81e4, // efivarfs
    ];
    // `f_type` is an i64 in glibc's `statfs` and a u64 in musl's.
    #[allow(clippy::unnecessary_cast)]
    let is_pseudo = |s: nix::sys::statfs::Statfs| PSEUDO.contains(&(s.filesystem_type().0 as i64));
    nix::sys::statfs::statfs(dir)
        .map(is_pseudo)
        .unwrap_or(false)
}

fn glob(pattern: &str, what: &str) -> Result<globset::GlobMatcher, ToolError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| {
            ToolError::invalid_args(format!("{what} {pattern:?} is not a valid glob: {e}"))
        })
}

/// The longest line searched: the searcher holds a whole line in memory, so without a cap one
/// 400 MB line cost the supervisor 420 MB per call (and calls run side by side). A file with a
/// longer line is left out of the results.
pub const MAX_LINE_BYTES: usize = 8 << 20;

fn searcher(context: usize) -> Searcher {
    SearcherBuilder::new()
        .heap_limit(Some(MAX_LINE_BYTES))
        .line_number(true)
        .binary_detection(BinaryDetection::quit(b'\0'))
        .before_context(context)
        .after_context(context)
        .build()
}

fn search_files(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    // With a remote backend the tool acts on that side's filesystem (SPEC §9).
    if let Some(remote) = crate::environments::agent::forward(
        "search_files",
        args,
        ctx,
        crate::environments::agent::FILE_TOOL_TIMEOUT,
    ) {
        return remote;
    }
    let a: SearchFilesArgs = parse(args)?;
    let pattern = a.pattern.as_str();
    if pattern.is_empty() {
        return Err(ToolError::invalid_args("argument `pattern` is empty"));
    }
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(ToolError::invalid_args(format!(
            "argument `pattern` is {} bytes; the limit is {MAX_PATTERN_BYTES}",
            pattern.len()
        )));
    }
    let target = match a.target {
        Target::Content => "content",
        Target::Files => "files",
    };
    let mode = match a.output_mode {
        OutputMode::Content => "content",
        OutputMode::FilesWithMatches => "files_with_matches",
        OutputMode::Count => "count",
    };
    let raw_path = check_path("path", &a.path)?;
    let limit = in_range("limit", a.limit, 1, MAX_LIMIT)? as u64;
    let offset = in_range("offset", a.offset, 0, i64::MAX)? as u64;
    let context = in_range("context", a.context, 0, 20)? as usize;
    let file_glob = match a.file_glob.as_deref() {
        Some(g) if !g.trim().is_empty() => Some((glob(g.trim(), "file_glob")?, g.contains('/'))),
        _ => None,
    };
    let root = if raw_path == "." {
        ctx.cwd.clone()
    } else {
        ctx.resolve(raw_path)
    };
    let meta = match &ctx.paths {
        Some(policy) => policy.check_read(&root)?,
        None => std::fs::metadata(&root).map_err(|e| ToolError::io(&root, &e))?,
    };
    if meta.is_dir() && on_kernel_pseudo_fs(&root) {
        return Err(ToolError::invalid_args(format!(
            "{} is on a kernel pseudo-filesystem (/proc, /sys, ...), whose files do not end or \
             wait for data; search a regular directory, or read one file there with read_file",
            root.display()
        )));
    }
    // A path named on purpose that is no file to search: an empty result would read as "no
    // match" (the walk skips such entries without a word).
    if !meta.is_dir() && !meta.is_file() {
        return Err(ToolError::new(
            crate::ToolErrorKind::NotARegularFile,
            format!(
                "{} is a device, FIFO or socket; search_files searches regular files and \
                 directories",
                root.display()
            ),
        ));
    }
    if meta.is_dir() && ctx.paths.is_none() {
        // A directory that cannot be listed gave an empty result, as if nothing matched.
        std::fs::read_dir(&root).map_err(|e| ToolError::io(&root, &e))?;
    }
    let walk = Walk {
        policy: ctx.paths.clone(),
        display_base: (!Path::new(raw_path).is_absolute()).then(|| ctx.cwd.clone()),
        root,
        file_glob,
        hidden: a.hidden,
        ended: crate::call_scope::ended_flag(ctx),
    };
    let abandoned = || crate::call_scope::abandoned("search_files");
    // Held until the reply is built: the regex, the walk and the counts are what it bounds.
    let Some(_slot) = SearchSlot::acquire(scope_key(ctx), &walk.ended) else {
        return Err(abandoned());
    };
    let page = |total: u64, shown: usize| {
        let end = offset + shown as u64;
        json!({
            "total": total,
            "offset": offset,
            "limit": limit,
            "truncated": end < total,
            "next_offset": if end < total { Value::from(end) } else { Value::Null },
        })
    };
    let merge = |mut base: Value, extra: Value| {
        if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
            b.extend(e);
        }
        base
    };

    match target {
        "files" => {
            let name_glob = glob(pattern, "pattern")?;
            let hits = walk.files(|p| {
                let name = p.file_name()?;
                (name_glob.is_match(name)
                    || p.strip_prefix(&walk.root)
                        .is_ok_and(|r| name_glob.is_match(r)))
                .then_some(())
            });
            if walk.ended.is_set() {
                return Err(abandoned());
            }
            let total = hits.len() as u64;
            // A count of names found is their total alone (it listed them, as if the mode
            // were ignored); "files_with_matches" is the listing a name search gives anyway.
            if let OutputMode::Count = a.output_mode {
                return Ok(merge(json!({"target": "files"}), page(total, 0)));
            }
            let files: Vec<String> = hits
                .iter()
                .skip(offset as usize)
                .take(limit as usize)
                .map(|(p, _)| walk.display(p))
                .collect();
            let n = files.len();
            return Ok(merge(
                json!({"target": "files", "files": files}),
                page(total, n),
            ));
        }
        "content" => {}
        other => {
            return Err(ToolError::invalid_args(format!(
                "argument `target` must be \"content\" or \"files\", got {other:?}"
            )))
        }
    }
    if !["content", "files_with_matches", "count"].contains(&mode) {
        return Err(ToolError::invalid_args(format!(
            "argument `output_mode` must be \"content\", \"files_with_matches\" or \"count\", got {mode:?}"
        )));
    }
    let matcher: RegexMatcher = RegexMatcherBuilder::new()
        .line_terminator(Some(b'\n'))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build(pattern)
        .map_err(|e| {
            ToolError::new(
                crate::ToolErrorKind::InvalidRegex,
                format!("pattern {pattern:?} is not a valid regex: {e}. Escape special characters (e.g. \\( \\.) for a literal search"),
            )
        })?;
    // Why the one file named as `path` was left out, if it was: said in the result, since
    // an empty result reads as "no match".
    let mut skipped = None;
    let counts: Vec<(PathBuf, u64)> = if meta.is_file() {
        let mut sink = CountSink::new();
        let searched = walk.search(&mut searcher(0), &matcher, &walk.root, &mut sink);
        if sink.1 {
            skipped = Some(
                "the file was not searched: it is binary (it holds a NUL byte); read_file \
                 refuses it too"
                    .to_string(),
            );
        } else if let Err(e) = searched {
            skipped = Some(format!(
                "the file was not searched past the point where it failed ({e}); a line over \
                 {} MiB is not searched: read_file reads such a file in cut lines",
                MAX_LINE_BYTES >> 20
            ));
        }
        sink.count()
            .map(|c| vec![(walk.root.clone(), c)])
            .unwrap_or_default()
    } else {
        walk.files(|p| {
            let mut s = searcher(0);
            let mut sink = CountSink::new();
            walk.search(&mut s, &matcher, p, &mut sink).ok()?;
            sink.count()
        })
    };
    if walk.ended.is_set() {
        return Err(abandoned());
    }
    let total_lines: u64 = counts.iter().map(|(_, c)| c).sum();
    let files_matched = counts.len();
    let result = match mode {
        "files_with_matches" => {
            let files: Vec<String> = counts
                .iter()
                .skip(offset as usize)
                .take(limit as usize)
                .map(|(p, _)| walk.display(p))
                .collect();
            let n = files.len();
            merge(
                json!({"files": files, "total_matches": total_lines}),
                page(files_matched as u64, n),
            )
        }
        "count" => {
            let rows: Vec<Value> = counts
                .iter()
                .skip(offset as usize)
                .take(limit as usize)
                .map(|(p, c)| json!({"path": walk.display(p), "count": c}))
                .collect();
            let n = rows.len();
            // Pages of files, as the rows are: `total` counts files (it counted lines, so a
            // caller following next_offset past the last file was sent back to it forever).
            merge(
                json!({"counts": rows, "files_matched": files_matched, "total_files": files_matched, "total_matches": total_lines}),
                page(files_matched as u64, n),
            )
        }
        _ => {
            let mut matches = Vec::new();
            let mut before: u64 = 0;
            let mut s = searcher(context);
            for (p, c) in &counts {
                if matches.len() as u64 >= limit {
                    break;
                }
                if before + c <= offset {
                    before += c;
                    continue;
                }
                let shown = walk.display(p);
                let mut sink = PageSink {
                    path: &shown,
                    skip: offset.saturating_sub(before),
                    want: limit - matches.len() as u64,
                    seen: 0,
                    pending_before: Vec::new(),
                    out: Vec::new(),
                    with_context: context > 0,
                };
                // A file changed between the passes just yields fewer lines; never an error.
                let _ = walk.search(&mut s, &matcher, p, &mut sink);
                matches.extend(sink.out);
                before += c;
            }
            let n = matches.len();
            merge(
                json!({"matches": matches, "files_matched": files_matched}),
                page(total_lines, n),
            )
        }
    };
    Ok(match skipped {
        Some(note) => merge(result, json!({ "skipped": note })),
        None => result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_file_named_as_path_and_left_out_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut long = vec![b'A'; MAX_LINE_BYTES + 1024];
        long.extend_from_slice(b" NEEDLE\n");
        std::fs::write(dir.path().join("long.txt"), &long).unwrap();
        std::fs::write(dir.path().join("bin.dat"), b"NEEDLE\0more NEEDLE\n").unwrap();
        std::fs::write(dir.path().join("plain.txt"), "no match here\n").unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        for (path, why) in [("long.txt", "MiB is not searched"), ("bin.dat", "binary")] {
            for mode in ["content", "count", "files_with_matches"] {
                let r = call(
                    dir.path(),
                    json!({"pattern": "NEEDLE", "path": path, "output_mode": mode}),
                )
                .unwrap();
                let note = r["skipped"].as_str().unwrap_or_default();
                assert!(note.contains(why), "{path} {mode}: {r}");
            }
        }
        // Searched and without a match: no note.
        let r = call(
            dir.path(),
            json!({"pattern": "NEEDLE", "path": "plain.txt"}),
        )
        .unwrap();
        assert!(r.get("skipped").is_none(), "{r}");
        let e = call(dir.path(), json!({"pattern": "NEEDLE", "path": "fifo"})).unwrap_err();
        assert_eq!(e.kind, crate::ToolErrorKind::NotARegularFile, "{e:?}");
    }

    #[test]
    fn a_line_past_the_cap_is_not_held_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut huge = vec![b'A'; MAX_LINE_BYTES * 3];
        huge.extend_from_slice(b"NEEDLE\n");
        std::fs::write(dir.path().join("huge.txt"), &huge).unwrap();
        std::fs::write(dir.path().join("small.txt"), "a NEEDLE here\n").unwrap();
        let r = call(dir.path(), json!({"pattern": "NEEDLE", "path": "."})).unwrap();
        let paths: Vec<&str> = r["matches"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["path"].as_str())
            .collect();
        assert_eq!(paths, ["small.txt"], "{r}");
        // The searcher's buffer stopped at the cap instead of growing to the line.
        let mut s = searcher(0);
        let mut sink = CountSink::new();
        let matcher = RegexMatcher::new("NEEDLE").unwrap();
        let err = s.search_path(&matcher, dir.path().join("huge.txt"), &mut sink);
        assert!(
            err.is_err(),
            "a line three times the cap was searched whole"
        );
    }

    /// One execution holding all its search slots does not hold another's: a process-wide
    /// set let one script's slow searches make every other execution's wait.
    #[test]
    fn search_slots_are_each_executions_own() {
        let (first, second) = (usize::MAX - 1, usize::MAX - 2);
        let never = crate::call_scope::EndedFlag::default();
        let held: Vec<SearchSlot> = (0..MAX_CONCURRENT_SEARCHES)
            .map(|_| SearchSlot::acquire(first, &never).unwrap())
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let slot = SearchSlot::acquire(second, &crate::call_scope::EndedFlag::default());
            let _ = tx.send(slot.is_some());
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true),
            "another execution waited for the first one's slots"
        );
        // The first execution's next search waits until one of its own ends.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let slot = SearchSlot::acquire(first, &crate::call_scope::EndedFlag::default());
            let _ = tx.send(slot.is_some());
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(500))
            .is_err());
        drop(held);
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true)
        );
    }

    /// Stop 54: a script's 40 threads each calling search_files with a pattern that fails
    /// only at the compiled-size limit took the supervisor to 1.87 GB. The pattern is refused
    /// at the lower limit, and no more than MAX_CONCURRENT_SEARCHES calls compile at once.
    #[test]
    fn expensive_patterns_are_refused_small_and_few_at_once() {
        let d = tree();
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let dir = d.path().to_path_buf();
                std::thread::spawn(move || call(&dir, json!({"pattern": r"(\w{100}){400}"})))
            })
            .collect();
        for t in threads {
            let e = t.join().unwrap().unwrap_err();
            assert_eq!(e.kind, "InvalidRegex", "{e:?}");
            // The limit the engine reports, read from its message: at most 8 MiB (it was
            // 50 MiB, ~69 MB of heap per refused call).
            let limit: u64 = e
                .message
                .split("size limit of ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no size limit in {}", e.message));
            assert!(limit <= 8 << 20, "compiled-regex limit {limit}");
        }
        // 12 calls at once, all waiting on a compile of seconds: fewer ran together.
        let peak = PEAK_RUNNING.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            (1..=MAX_CONCURRENT_SEARCHES).contains(&peak) && peak < 12,
            "{peak} searches ran at once"
        );
        // A Unicode `\w{100}` still compiles under the limit.
        call(d.path(), json!({"pattern": r"\w{100}"})).unwrap();
    }

    fn call(cwd: &Path, args: Value) -> Result<Value, ToolError> {
        let ctx = ToolContext::agent(cwd);
        search_files(args.as_object().unwrap(), &ctx)
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &[u8]| {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, s).unwrap();
        };
        w("a.yaml", b"database: pg\nport: 5432\n");
        w("sub/b.yaml", b"x\ndatabase: sqlite\ny\n");
        w("sub/c.txt", b"database here too\n");
        w("ignored/d.yaml", b"database: hidden by gitignore\n");
        w(".gitignore", b"ignored/\n");
        w("bin.dat", b"database\0\x01\x02");
        w("latin1.txt", b"caf\xe9 database\n");
        d
    }

    #[test]
    fn content_search_respects_gitignore_and_skips_binary() {
        let d = tree();
        let r = call(d.path(), json!({"pattern": "database"})).unwrap();
        let paths: Vec<&str> = r["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["a.yaml", "latin1.txt", "sub/b.yaml", "sub/c.txt"]);
        assert_eq!(r["total"], 4);
        assert_eq!(r["truncated"], false);
        assert_eq!(r["matches"][2]["line"], 2);
        assert_eq!(r["matches"][2]["content"], "database: sqlite");
        assert!(r["matches"][1]["content"]
            .as_str()
            .unwrap()
            .contains("caf\u{fffd}"));
    }

    #[test]
    fn hidden_files_are_searched_when_asked_and_git_s_store_never() {
        let d = tree();
        let w = |p: &str, s: &str| {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, s).unwrap();
        };
        w(".env.example", "database_url=\n");
        w(".github/workflows/ci.yml", "database: service\n");
        w(".git/config", "[database]\n");
        w("sub/.git/HEAD", "database\n");
        let paths = |r: &Value, key: &str| -> Vec<String> {
            r[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.get("path").unwrap_or(m).as_str().unwrap().to_string())
                .collect()
        };
        let r = call(d.path(), json!({"pattern": "database"})).unwrap();
        assert_eq!(
            paths(&r, "matches"),
            ["a.yaml", "latin1.txt", "sub/b.yaml", "sub/c.txt"]
        );
        let r = call(d.path(), json!({"pattern": "database", "hidden": true})).unwrap();
        assert_eq!(
            paths(&r, "matches"),
            [
                ".env.example",
                ".github/workflows/ci.yml",
                "a.yaml",
                "latin1.txt",
                "sub/b.yaml",
                "sub/c.txt"
            ]
        );
        let r = call(
            d.path(),
            json!({"pattern": "*.yml", "target": "files", "hidden": true}),
        )
        .unwrap();
        assert_eq!(paths(&r, "files"), [".github/workflows/ci.yml"]);
        let r = call(d.path(), json!({"pattern": "*.yml", "target": "files"})).unwrap();
        assert_eq!(r["total"], 0, "{r}");
    }

    #[test]
    fn glob_paging_modes_and_context() {
        let d = tree();
        let r = call(
            d.path(),
            json!({"pattern": "database", "file_glob": "*.yaml", "limit": 1}),
        )
        .unwrap();
        assert_eq!(r["matches"].as_array().unwrap().len(), 1);
        assert_eq!(r["total"], 2);
        assert_eq!(r["next_offset"], 1);
        let r = call(
            d.path(),
            json!({"pattern": "database", "file_glob": "*.yaml", "offset": 1, "context": 1}),
        )
        .unwrap();
        assert_eq!(r["matches"][0]["path"], "sub/b.yaml");
        assert_eq!(r["matches"][0]["context_before"], json!(["x"]));
        assert_eq!(r["matches"][0]["context_after"], json!(["y"]));
        assert_eq!(r["next_offset"], Value::Null);
        let r = call(
            d.path(),
            json!({"pattern": "database", "output_mode": "files_with_matches"}),
        )
        .unwrap();
        assert_eq!(r["files"].as_array().unwrap().len(), 4);
        let r = call(
            d.path(),
            json!({"pattern": "a", "output_mode": "count", "path": "sub"}),
        )
        .unwrap();
        assert_eq!(r["counts"][0]["path"], "sub/b.yaml");
        // Paged by file: following next_offset ends.
        let mut offset = 0;
        let mut rows = 0;
        for _ in 0..10 {
            let r = call(
                d.path(),
                json!({"pattern": "a", "output_mode": "count", "limit": 1, "offset": offset}),
            )
            .unwrap();
            rows += r["counts"].as_array().unwrap().len();
            assert_eq!(r["total"], r["files_matched"], "{r}");
            match r["next_offset"].as_u64() {
                Some(next) => offset = next,
                None => break,
            }
        }
        let all = call(d.path(), json!({"pattern": "a", "output_mode": "count"})).unwrap();
        assert_eq!(rows as u64, all["files_matched"].as_u64().unwrap());
        assert!(
            all["total_matches"].as_u64().unwrap() >= rows as u64,
            "{all}"
        );
        let r = call(d.path(), json!({"pattern": "*.yaml", "target": "files"})).unwrap();
        assert_eq!(r["files"], json!(["a.yaml", "sub/b.yaml"]));
        let r = call(
            d.path(),
            json!({"pattern": "*.yaml", "target": "files", "output_mode": "count"}),
        )
        .unwrap();
        assert_eq!(r["total"], 2, "a count of names is their total: {r}");
        assert!(r.get("files").is_none(), "and lists none: {r}");
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let d = tree();
        let e = call(d.path(), json!({"pattern": "("})).unwrap_err();
        assert_eq!(e.kind, "InvalidRegex");
        let e = call(d.path(), json!({"pattern": "x", "path": "nope"})).unwrap_err();
        assert_eq!(e.kind, "FileNotFound");
        let e = call(d.path(), json!({"pattern": "x", "target": "dirs"})).unwrap_err();
        assert_eq!(e.kind, "InvalidArguments");
        let e = call(d.path(), json!({"pattern": "x".repeat(10_000)})).unwrap_err();
        assert_eq!(e.kind, "InvalidArguments");
        // A misspelled argument is refused with the names the tool takes, not ignored (it
        // searched every file).
        let e = call(d.path(), json!({"pattern": "port", "glob": "*.yaml"})).unwrap_err();
        assert_eq!(e.kind, "InvalidArguments");
        assert!(
            e.message.contains("unknown argument `glob`") && e.message.contains("`file_glob`"),
            "{}",
            e.message
        );
        let r = call(d.path(), json!({"pattern": "port", "path": "a.yaml"})).unwrap();
        assert_eq!(r["matches"][0]["path"], "a.yaml");
    }

    #[test]
    fn a_file_found_binary_past_its_first_buffer_is_left_out_whole() {
        // 100,000 matching lines, then NUL bytes: the NUL is found buffers after the first
        // matches, which were counted (total 98,298) although the file counts as binary.
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = "hello\n".repeat(100_000).into_bytes();
        bytes.extend_from_slice(&[0u8; 64]);
        std::fs::write(dir.path().join("late-binary.dat"), &bytes).unwrap();
        std::fs::write(dir.path().join("text.txt"), "hello\n").unwrap();
        let r = call(
            dir.path(),
            json!({"pattern": "hello", "output_mode": "count"}),
        )
        .unwrap();
        assert_eq!(r["total"], 1, "{r}");
        assert_eq!(r["counts"][0]["path"], "text.txt", "{r}");
    }

    #[test]
    fn kernel_pseudo_filesystems_are_not_walked() {
        // `/proc/kmsg` waits for data and `/proc/kcore` does not end: a walk into /proc held a
        // supervisor thread forever. A dir there is refused; one file there is searched.
        let e = call(Path::new("/"), json!({"pattern": "x", "path": "/proc"})).unwrap_err();
        assert_eq!(e.kind, "InvalidArguments", "{e:?}");
        assert!(e.message.contains("pseudo-filesystem"), "{e:?}");
        let r = call(
            Path::new("/"),
            json!({"pattern": "^Name:", "path": "/proc/self/status", "output_mode": "count"}),
        )
        .unwrap();
        assert_eq!(r["total"], 1, "{r}");
        assert!(on_kernel_pseudo_fs(Path::new("/sys")));
        assert!(!on_kernel_pseudo_fs(tree().path()));
    }

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<SearchFilesArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regex (content search) or glob such as *.py (target=\"files\")"},
                    "target": {"type": "string", "enum": ["content", "files"], "default": "content"},
                    "path": {"type": "string", "default": ".", "description": "Directory or file to search"},
                    "file_glob": {"type": "string", "description": "Only files whose name (or, with a /, relative path) matches this glob, e.g. *.yaml"},
                    "limit": {"type": "integer", "default": 50, "minimum": 1, "maximum": MAX_LIMIT},
                    "offset": {"type": "integer", "default": 0, "minimum": 0, "description": "Results to skip (use next_offset)"},
                    "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"], "default": "content"},
                    "context": {"type": "integer", "default": 0, "minimum": 0, "maximum": 20, "description": "Lines of context around each match"},
                    "hidden": {"type": "boolean", "default": false, "description": "Also search hidden files and directories (names starting with a dot); .git is never searched"}
                },
                "required": ["pattern"]
            }),
            json!({"pattern": "database", "path": ".", "file_glob": "*.yaml", "limit": 20}),
            json!({"pattern": "x", "limit": "many"}),
        );
    }
}
