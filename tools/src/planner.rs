//! The tool calls of one model turn, planned in segments (SPEC §7).
//!
//! A model often asks for several calls at once. Running them all in parallel would race a
//! write against a read of the same file; running them all in order wastes the turn on network
//! waits. So the batch is cut into segments, kept in call order:
//! - read-only tools (`parallel_safe`: reads, searches, web) join the current parallel segment,
//!   unless they read a path a write of the segment touches (then a new segment starts);
//! - path-scoped writes (`path_arg`: `write_file`, `patch`) join it too, unless their path is
//!   the same as, inside, or above a path another call of the segment reads or writes — then a
//!   new segment starts, so the earlier call finishes first;
//! - the path a read-only call reads is its `path` argument, or when the call leaves it out the
//!   schema's default for it (`search_files` searches `.`, the cwd), resolved as the tool
//!   resolves it. A read whose path cannot be known (its tool takes a `path` but the call gives
//!   none the tool could use, and the schema has no default) runs beside other reads but never
//!   beside a write: it could be reading anything. A read-only tool that takes no `path` at all
//!   (`web_search`, `web_extract`) reads no file and joins any segment;
//! - everything else (terminal, execute_code, host tools, a write whose path is not known) is a
//!   segment of its own: it runs after everything before it and before everything after it.
//!
//! Paths are compared lexically after resolving them against the call's cwd (`..` and `.`
//! folded), without touching the filesystem: a symlink can make two different paths one file,
//! which at worst orders nothing wrongly that the same model turn would not race anyway, and
//! never reorders calls across a segment boundary. Results come back in call order.

use crate::{ToolCall, ToolContext, ToolEntry, ToolRegistry, MAX_PARALLEL_TOOL_CALLS};
use serde_json::Value;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One segment of a planned batch: indices into the batch, in call order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// These calls may run at the same time.
    Parallel(Vec<usize>),
    /// This call runs alone.
    Sequential(usize),
}

/// How the planner sees one call.
enum Kind {
    /// Read-only; what it reads.
    Read(Reads),
    /// Writes the one file at this path.
    Write(PathBuf),
    /// Anything else: runs alone.
    Barrier,
}

/// What a read-only call reads.
enum Reads {
    /// No file: the tool takes no `path` (web tools).
    Nothing,
    /// This path (a file, or a directory and everything below it).
    Path(PathBuf),
    /// A path the planner cannot know: anything.
    Unknown,
}

/// A path as a file tool resolves it (relative to the cwd, `~` to the caller's home), folded
/// lexically; `None` for values the tool refuses (not text, empty, or holding a NUL).
fn resolved(value: &Value, ctx: &ToolContext) -> Option<PathBuf> {
    value
        .as_str()
        .filter(|p| !p.is_empty() && !p.contains('\0'))
        .map(|p| lexical(&ctx.resolve(p)))
}

/// What a read-only call of `entry` reads: its `path` argument, or the schema's default for it
/// when the call leaves it out (or sends null, which the tools read as left out).
fn read_target(entry: &ToolEntry, call: &ToolCall, ctx: &ToolContext) -> Reads {
    let declared = entry.schema.get("properties").and_then(|p| p.get("path"));
    let given = call.args.get("path").filter(|v| !v.is_null());
    let value = match (given, declared) {
        (Some(v), _) => v,
        (None, None) => return Reads::Nothing,
        (None, Some(schema)) => match schema.get("default") {
            Some(d) => d,
            None => return Reads::Unknown,
        },
    };
    resolved(value, ctx).map_or(Reads::Unknown, Reads::Path)
}

fn kind(reg: &ToolRegistry, call: &ToolCall, ctx: &ToolContext) -> Kind {
    let Some(entry) = reg.get(&call.name) else {
        return Kind::Barrier;
    };
    let path_of = |arg: &str| call.args.get(arg).and_then(|v| resolved(v, ctx));
    if let Some(arg) = &entry.path_arg {
        // `patch` in diff mode names its files inside the diff: not known here.
        let diff_mode = call.args.get("mode").and_then(Value::as_str) == Some("patch");
        return match path_of(arg) {
            Some(p) if !diff_mode => Kind::Write(p),
            _ => Kind::Barrier,
        };
    }
    if entry.parallel_safe {
        return Kind::Read(read_target(&entry, call, ctx));
    }
    Kind::Barrier
}

/// `p` with `.` dropped and `..` applied to the components before it.
pub(crate) fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Whether `a` and `b` are the same path or one contains the other.
fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Cuts `calls` into segments (see the module docs).
pub fn plan(reg: &ToolRegistry, calls: &[ToolCall], ctx: &ToolContext) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut group = Group::default();
    for (i, call) in calls.iter().enumerate() {
        match kind(reg, call, ctx) {
            Kind::Barrier => {
                group.flush(&mut segments);
                segments.push(Segment::Sequential(i));
            }
            Kind::Read(Reads::Nothing) => group.calls.push(i),
            Kind::Read(Reads::Path(p)) => {
                if group.writes.iter().any(|w| overlap(w, &p)) {
                    group.flush(&mut segments);
                }
                group.reads.push(p);
                group.calls.push(i);
            }
            Kind::Read(Reads::Unknown) => {
                if !group.writes.is_empty() {
                    group.flush(&mut segments);
                }
                group.reads_unknown = true;
                group.calls.push(i);
            }
            Kind::Write(p) => {
                if group.reads_unknown
                    || group
                        .writes
                        .iter()
                        .chain(group.reads.iter())
                        .any(|o| overlap(o, &p))
                {
                    group.flush(&mut segments);
                }
                group.writes.push(p);
                group.calls.push(i);
            }
        }
    }
    group.flush(&mut segments);
    segments
}

/// The segment being built, and what its calls read and write.
#[derive(Default)]
struct Group {
    calls: Vec<usize>,
    reads: Vec<PathBuf>,
    writes: Vec<PathBuf>,
    /// A call of the segment reads a path that cannot be known: no write may join.
    reads_unknown: bool,
}

impl Group {
    /// Ends the segment (if it has calls) and starts an empty one.
    fn flush(&mut self, out: &mut Vec<Segment>) {
        match self.calls.len() {
            0 => {}
            1 => out.push(Segment::Sequential(self.calls[0])),
            _ => out.push(Segment::Parallel(std::mem::take(&mut self.calls))),
        }
        *self = Group::default();
    }
}

/// Runs `calls` segment by segment; results in call order.
pub fn run(reg: &ToolRegistry, calls: &[ToolCall], ctx: &ToolContext) -> Vec<String> {
    let mut results: Vec<Option<String>> = vec![None; calls.len()];
    for segment in plan(reg, calls, ctx) {
        match segment {
            Segment::Sequential(i) => {
                if let Some(c) = calls.get(i) {
                    results[i] = Some(reg.handle_function_call(&c.name, &c.args, ctx));
                }
            }
            Segment::Parallel(idx) => {
                for (i, r) in idx.iter().zip(run_parallel(reg, calls, &idx, ctx)) {
                    results[*i] = Some(r);
                }
            }
        }
    }
    results
        .into_iter()
        .zip(calls)
        .map(|(r, c)| {
            r.unwrap_or_else(|| {
                serde_json::json!({"error": format!("Error executing {}: the call did not run", c.name)})
                    .to_string()
            })
        })
        .collect()
}

/// Runs the calls at `idx` at the same time (at most [`MAX_PARALLEL_TOOL_CALLS`] threads).
fn run_parallel(
    reg: &ToolRegistry,
    calls: &[ToolCall],
    idx: &[usize],
    ctx: &ToolContext,
) -> Vec<String> {
    let results: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; idx.len()]);
    let next = AtomicUsize::new(0);
    let work = || loop {
        let k = next.fetch_add(1, Ordering::SeqCst);
        let Some(call) = idx.get(k).and_then(|i| calls.get(*i)) else {
            break;
        };
        let text = reg.handle_function_call(&call.name, &call.args, ctx);
        results.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(text);
    };
    std::thread::scope(|scope| {
        for _ in 1..idx.len().min(MAX_PARALLEL_TOOL_CALLS) {
            if let Err(e) = std::thread::Builder::new()
                .name("vibeos-tool-call".into())
                .spawn_scoped(scope, work)
            {
                // Fewer workers only means less parallelism; this thread still works.
                tracing::warn!("cannot start a parallel tool-call worker: {e}");
                break;
            }
        }
        work();
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| "{\"error\": \"the call did not run\"}".to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolEntry;
    use serde_json::json;

    fn reg() -> ToolRegistry {
        let reg = ToolRegistry::new();
        let obj = json!({"type": "object"});
        let path = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        let search = json!({"type": "object", "properties": {
            "path": {"type": "string", "default": "."}}});
        let ok = |_: &serde_json::Map<String, Value>, _: &ToolContext| Ok(json!({}));
        for e in [
            ToolEntry::new("read", "t", "R.", path, ok).with_parallel_safe(true),
            ToolEntry::new("search", "t", "S.", search, ok).with_parallel_safe(true),
            ToolEntry::new("web", "t", "W.", obj.clone(), ok).with_parallel_safe(true),
            ToolEntry::new("write", "t", "W.", obj.clone(), ok).with_path_scoped("path"),
            ToolEntry::new("shell", "t", "S.", obj, ok),
        ] {
            if let Err(e) = reg.register(e) {
                panic!("{e}");
            }
        }
        reg
    }

    fn c(name: &str, path: Option<&str>) -> ToolCall {
        ToolCall::new(name, path.map_or(json!({}), |p| json!({"path": p})))
    }

    #[test]
    fn segments_follow_the_rules() {
        let reg = reg();
        let ctx = ToolContext::agent("/w");
        let calls = [
            c("read", Some("a")),
            c("web", None),
            c("write", Some("b")),
            c("write", Some("./c")),
            c("write", Some("sub/../b")), // same file as call 2: new segment
            c("read", Some("b")),         // reads what call 4 writes: new segment
            c("shell", None),
            c("read", Some("/w")),
            c("write", Some("/w/x")), // inside what call 7 reads
        ];
        assert_eq!(
            plan(&reg, &calls, &ctx),
            vec![
                Segment::Parallel(vec![0, 1, 2, 3]),
                Segment::Sequential(4),
                Segment::Sequential(5),
                Segment::Sequential(6),
                Segment::Sequential(7),
                Segment::Sequential(8),
            ]
        );
        let unknown = [c("nope", None), c("read", None), c("read", None)];
        assert_eq!(
            plan(&reg, &unknown, &ctx),
            vec![Segment::Sequential(0), Segment::Parallel(vec![1, 2])]
        );
    }

    #[test]
    fn reads_without_a_path_read_their_default_or_anything() {
        let reg = reg();
        let ctx = ToolContext::agent("/w");
        // `search` without a path searches its default, the cwd: a write below it waits.
        let calls = [c("search", None), c("write", Some("a")), c("web", None)];
        assert_eq!(
            plan(&reg, &calls, &ctx),
            vec![Segment::Sequential(0), Segment::Parallel(vec![1, 2])]
        );
        let calls = [c("write", Some("a")), c("search", None)];
        assert_eq!(
            plan(&reg, &calls, &ctx),
            vec![Segment::Sequential(0), Segment::Sequential(1)]
        );
        // ... but not a write elsewhere, nor one after a search of another dir.
        let calls = [c("search", None), c("write", Some("/elsewhere/a"))];
        assert_eq!(
            plan(&reg, &calls, &ctx),
            vec![Segment::Parallel(vec![0, 1])]
        );
        let calls = [c("search", Some("/w/sub")), c("write", Some("a"))];
        assert_eq!(
            plan(&reg, &calls, &ctx),
            vec![Segment::Parallel(vec![0, 1])]
        );
        // A read whose path cannot be known (none given, no default; not text) runs beside
        // other reads, never beside a write, on either side.
        let bad = ToolCall::new("read", json!({"path": 5}));
        for unknown in [c("read", None), bad] {
            let calls = [
                c("write", Some("/x")),
                unknown.clone(),
                c("read", Some("/y")),
                c("write", Some("/z")),
            ];
            assert_eq!(
                plan(&reg, &calls, &ctx),
                vec![
                    Segment::Sequential(0),
                    Segment::Parallel(vec![1, 2]),
                    Segment::Sequential(3)
                ]
            );
        }
    }
}
