//! The command line a shell reading a background process's stdin is building, so the approval
//! check of `process(action="write")` judges what will run rather than each write alone.
//!
//! A shell started with `terminal("bash", background=true, pty=true)` runs a line when it gets
//! a newline, after its line editor has applied the backspaces and kill-line keys in it. Judged
//! write by write, `"rm -"` then `"r DIR\n"`, `"rm -x\x7fr DIR\n"` (a backspace) or
//! `"rm -\x16r DIR\n"` (Ctrl-V) each look harmless, and `"R=-r\n"` then `"rm $R DIR\n"` hides
//! the flag in a variable set by an earlier line (probe of stop 53). So per process this keeps
//! the unfinished line and the variable assignments of recent lines; a write is judged as
//! those assignments followed by the line(s) it completes or continues, edited as the shell
//! would edit them. Cursor motion (arrows, Ctrl-A) can still compose a line out of order; that
//! limit is written down in docs/approvals.md.

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};

/// Assignments of earlier lines kept per process (the newest).
const MAX_ASSIGNMENTS: usize = 32;
/// An unfinished line longer than this is judged and kept by its end only.
const MAX_PARTIAL: usize = 64 * 1024;
/// Processes whose typing is remembered; beyond that the oldest entry is forgotten.
const MAX_PROCESSES: usize = 1024;

#[derive(Default)]
struct Typed {
    assignments: VecDeque<String>,
    partial: String,
    /// Order of first use, to forget the oldest when full.
    serial: u64,
}

static TYPED: LazyLock<Mutex<HashMap<(String, String), Typed>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn key(task: Option<&str>, process: &str) -> (String, String) {
    (task.unwrap_or_default().to_string(), process.to_string())
}

/// What writing `data` to `process` (of `task`) makes the shell there run or hold: the
/// assignments of its earlier lines, then the lines `data` completes and the unfinished rest,
/// each as the line editor leaves it. Judge this text as well as `data` itself.
pub(crate) fn text_to_judge(task: Option<&str>, process: &str, data: &str) -> String {
    let typed = TYPED.lock().map(|g| {
        g.get(&key(task, process)).map(|t| {
            (
                t.assignments.iter().cloned().collect::<Vec<_>>(),
                t.partial.clone(),
            )
        })
    });
    let (assignments, partial) = typed.ok().flatten().unwrap_or_default();
    let (lines, rest) = edit(&partial, data);
    let mut out: Vec<String> = assignments;
    out.extend(lines);
    if !rest.is_empty() {
        out.push(rest);
    }
    out.join("\n")
}

/// Records `data` as written to `process` (after the write was allowed and made).
pub(crate) fn record(task: Option<&str>, process: &str, data: &str) {
    let Ok(mut map) = TYPED.lock() else {
        return;
    };
    if map.len() >= MAX_PROCESSES && !map.contains_key(&key(task, process)) {
        if let Some(oldest) = map
            .iter()
            .min_by_key(|(_, t)| t.serial)
            .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let typed = map.entry(key(task, process)).or_insert_with(|| Typed {
        serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ..Typed::default()
    });
    let (lines, rest) = edit(&typed.partial, data);
    for line in lines {
        if is_assignment(&line) {
            typed.assignments.push_back(line);
            if typed.assignments.len() > MAX_ASSIGNMENTS {
                typed.assignments.pop_front();
            }
        }
    }
    typed.partial = rest;
}

/// The lines that `partial` followed by `data` completes, and the unfinished rest, with
/// backspace/DEL (erase a character), Ctrl-U (erase the line), Ctrl-W (erase a word) applied
/// and Ctrl-V (take the next character literally) dropped, as a line editor would.
fn edit(partial: &str, data: &str) -> (Vec<String>, String) {
    let mut lines = Vec::new();
    let mut line = partial.to_string();
    let mut literal = false;
    for c in data.chars() {
        if literal {
            literal = false;
            if c != '\n' && c != '\r' {
                line.push(c);
                continue;
            }
        }
        match c {
            '\n' | '\r' => lines.push(std::mem::take(&mut line)),
            '\x7f' | '\x08' => {
                line.pop();
            }
            '\x15' => line.clear(),
            '\x17' => {
                let kept = line.trim_end().len();
                line.truncate(kept);
                let word_start = line.rfind(char::is_whitespace).map_or(0, |i| i + 1);
                line.truncate(word_start);
            }
            '\x16' => literal = true,
            c => line.push(c),
        }
    }
    lines.retain(|l| !l.trim().is_empty());
    if line.len() > MAX_PARTIAL {
        let mut cut = line.len() - MAX_PARTIAL;
        while !line.is_char_boundary(cut) {
            cut += 1;
        }
        line = line[cut..].to_string();
    }
    (lines, line)
}

/// Whether `line` only sets variables (`R=-r`, `export C=rm`), which later lines may use.
fn is_assignment(line: &str) -> bool {
    let line = line.trim();
    let line = ["export ", "declare ", "typeset ", "local ", "readonly "]
        .iter()
        .find_map(|p| line.strip_prefix(p))
        .unwrap_or(line)
        .trim_start();
    line.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_editor_is_applied_across_writes() {
        assert_eq!(
            edit("", "rm -x\x7fr d\n"),
            (vec!["rm -r d".to_string()], String::new())
        );
        assert_eq!(edit("", "rm -\x16r d\n").0, ["rm -r d"]);
        assert_eq!(edit("echo hi", "\x15rm -r d").1, "rm -r d");
        assert_eq!(edit("", "ls stuff\x17-r d\r").0, ["ls -r d"]);
        assert_eq!(edit("rm -", "r d\nls").0, ["rm -r d"]);
        assert_eq!(edit("rm -", "r d\nls").1, "ls");
    }

    #[test]
    fn writes_are_judged_with_what_came_before() {
        let (task, id) = (Some("typed-test"), "proc_typed_1");
        record(task, id, "R=-r\n");
        record(task, id, "rm -");
        let text = text_to_judge(task, id, "$R d\n");
        assert_eq!(text, "R=-r\nrm -$R d");
        // Another process of the same task starts clean.
        assert_eq!(text_to_judge(task, "proc_typed_2", "x\n"), "x");
        assert!(is_assignment("export C=rm"));
        assert!(!is_assignment("rm -r d"));
        assert!(!is_assignment("1A=x"));
    }
}
