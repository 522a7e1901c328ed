//! `read_file`: a page of a text file with line numbers, without loading the whole file.

use super::args::{check_path, in_range, parse, schema_for};
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};

/// Longest line shown; longer lines are cut with a marker so one line cannot flood the result.
const MAX_LINE_CHARS: usize = 2000;
/// Most lines one call returns.
const MAX_LIMIT: i64 = 5000;
/// The most content one page of a direct agent call holds: later lines of the page are left
/// for the next one (`next_offset`), so the call returns at most this much however long its
/// lines are (5,000 lines of 2,000 characters put 10 MB into the agent's context). Large enough
/// that a full page of ordinary source lines (5,000 of up to 200 characters) is never split.
/// A script's call has no such cap: what it reads stays in the script, which prints what the
/// model sees.
const MAX_AGENT_PAGE_BYTES: usize = 1024 * 1024;

/// The arguments of `read_file`: its schema and its parser.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadFileArgs {
    /// File to read, absolute or relative to the working directory
    path: String,
    /// First line to return (1-based)
    #[serde(default = "first_line")]
    #[schemars(range(min = 1))]
    offset: i64,
    /// Most lines to return
    #[serde(default = "default_limit")]
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: i64,
}

fn first_line() -> i64 {
    1
}

fn default_limit() -> i64 {
    500
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "read_file",
        "file",
        "Read a text file as numbered lines (`LINE|text`), a page at a time. Returns content, \
         total_lines and next_offset when more remains.",
        schema_for::<ReadFileArgs>(),
        read_file,
    )
    .with_emoji("📖")
    .bounded()
    .with_parallel_safe(true)
}

inventory::submit! { BuiltinTool(entry) }

fn read_file(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    // With a remote backend the tool acts on that side's filesystem (SPEC §9).
    if let Some(remote) = crate::environments::agent::forward(
        "read_file",
        args,
        ctx,
        crate::environments::agent::FILE_TOOL_TIMEOUT,
    ) {
        return remote;
    }
    let a: ReadFileArgs = parse(args)?;
    let raw = check_path("path", &a.path)?;
    let offset = in_range("offset", a.offset, 1, i64::MAX)? as u64;
    let limit = in_range("limit", a.limit, 1, MAX_LIMIT)? as u64;
    let path = ctx.resolve(raw);
    // open + fstat + one read is all a small file costs; a tool call's latency budget is tens
    // of microseconds.
    let (mut file, meta) = super::file_open::open_regular_file(
        &path,
        ctx,
        super::file_open::Refusals {
            directory: "; list it with search_files(target=\"files\") instead",
            not_a_file: "read_file only reads files",
        },
    )?;
    let mut head = [0u8; 8192];
    let n = read_up_to(&mut file, &mut head, meta.len()).map_err(|e| ToolError::io(&path, &e))?;
    if head[..n].contains(&0) {
        return Err(ToolError::new(
            crate::ToolErrorKind::BinaryFile,
            format!(
                "{} looks binary (it contains NUL bytes); read_file only shows text",
                path.display()
            ),
        ));
    }
    // A regular file that fit in the first read needs no further reads.
    let page_cap = match ctx.origin {
        crate::CallOrigin::Agent => MAX_AGENT_PAGE_BYTES,
        crate::CallOrigin::Script => usize::MAX,
    };
    let whole = meta.is_file() && (n as u64) >= meta.len() && n < head.len();
    let page = if whole {
        read_page(std::io::Cursor::new(&head[..n]), offset, limit, page_cap)
    } else {
        let reader =
            BufReader::with_capacity(64 * 1024, std::io::Cursor::new(&head[..n]).chain(file));
        read_page(reader, offset, limit, page_cap)
    }
    .map_err(|e| ToolError::io(&path, &e))?;
    let end = offset + page.returned;
    let more = end <= page.total_lines;
    let mut result = json!({
        "path": raw,
        "content": page.content,
        "total_lines": page.total_lines,
        "offset": offset,
        "lines_returned": page.returned,
        "truncated": more,
        "next_offset": if more { Value::from(end) } else { Value::Null },
        "file_size": meta.len(),
    });
    // `truncated` says more lines follow (with next_offset to page on); a line cut short is
    // said apart, or a reader of the flags alone would take the page for the whole text.
    if page.cut > 0 {
        result["lines_cut"] = Value::from(page.cut);
    }
    // An empty page past the end is said, or it reads as an empty stretch of the file.
    if page.returned == 0 && offset > 1 {
        result["note"] = Value::from(format!(
            "offset {offset} is past the end of the file ({} line{}); nothing was read",
            page.total_lines,
            if page.total_lines == 1 { "" } else { "s" }
        ));
    }
    Ok(result)
}

/// Fills `buf` from `file`, stopping early once `expected` bytes (the size fstat reported)
/// are in, so a small file costs one read.
fn read_up_to(file: &mut File, buf: &mut [u8], expected: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() && (filled as u64) < expected.max(1) {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

struct Page {
    content: String,
    total_lines: u64,
    returned: u64,
    /// Lines of the page cut at [`MAX_LINE_CHARS`].
    cut: u64,
}

/// Streams the file once: keeps lines `offset..offset+limit` (each cut at [`MAX_LINE_CHARS`])
/// and counts the rest, holding at most one kept line's worth of bytes beyond the page.
fn read_page(
    mut reader: impl BufRead,
    offset: u64,
    limit: u64,
    page_cap: usize,
) -> std::io::Result<Page> {
    let mut content = String::new();
    let mut line_no: u64 = 1;
    let mut returned = 0;
    let mut cut = 0;
    let mut current: Vec<u8> = Vec::new();
    let mut current_len: usize = 0;
    let mut in_line = false;
    let max_bytes = MAX_LINE_CHARS * 4;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        // Content only grows when a line ends, so a line kept at its first chunk is kept whole.
        let keep = line_no >= offset && line_no < offset + limit && content.len() < page_cap;
        let (chunk, consumed, ended) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        in_line = true;
        if keep && current.len() < max_bytes {
            let room = max_bytes - current.len();
            current.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        current_len += chunk.len();
        reader.consume(consumed);
        if ended {
            if keep {
                cut += u64::from(push_line(&mut content, line_no, &current, current_len));
                returned += 1;
            }
            current.clear();
            current_len = 0;
            in_line = false;
            line_no += 1;
        }
    }
    if in_line {
        if line_no >= offset && line_no < offset + limit && content.len() < page_cap {
            cut += u64::from(push_line(&mut content, line_no, &current, current_len));
            returned += 1;
        }
        line_no += 1;
    }
    Ok(Page {
        content,
        total_lines: line_no - 1,
        returned,
        cut,
    })
}

/// Appends line `line_no`; whether it was cut at [`MAX_LINE_CHARS`].
fn push_line(out: &mut String, line_no: u64, bytes: &[u8], full_len: usize) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_suffix('\r').unwrap_or(&text);
    out.push_str(&format!("{line_no:>6}|"));
    let cut = match text.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => {
            out.push_str(&text[..cut]);
            out.push_str(&format!(" … [line cut: {full_len} bytes]"));
            true
        }
        None => {
            out.push_str(text);
            false
        }
    };
    out.push('\n');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &str, offset: u64, limit: u64) -> Page {
        read_page(
            std::io::Cursor::new(text.as_bytes().to_vec()),
            offset,
            limit,
            MAX_AGENT_PAGE_BYTES,
        )
        .unwrap()
    }

    #[test]
    fn numbers_lines_and_counts_them_all() {
        let p = page("a\nb\nc\n", 2, 1);
        assert_eq!(p.content, "     2|b\n");
        assert_eq!(p.total_lines, 3);
        assert_eq!(p.returned, 1);
        let p = page("a\nb", 1, 10);
        assert_eq!(p.content, "     1|a\n     2|b\n");
        assert_eq!(p.total_lines, 2);
        assert_eq!(page("", 1, 10).total_lines, 0);
    }

    #[test]
    fn a_page_past_the_end_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("two.txt"), "a\nb\n").unwrap();
        let ctx = ToolContext::agent(dir.path());
        let read = |offset: u64| {
            let args = json!({"path": "two.txt", "offset": offset});
            read_file(args.as_object().unwrap(), &ctx).unwrap()
        };
        let past = read(50);
        assert_eq!(past["lines_returned"], 0);
        assert_eq!(
            past["note"],
            "offset 50 is past the end of the file (2 lines); nothing was read"
        );
        assert!(
            read(2).get("note").is_none(),
            "a page inside the file has no note"
        );
        std::fs::write(dir.path().join("two.txt"), "").unwrap();
        assert!(
            read(1).get("note").is_none(),
            "an empty file read from line 1 has no note"
        );
    }

    #[test]
    fn cuts_huge_lines() {
        let long = "x".repeat(10_000);
        let p = page(&long, 1, 1);
        assert!(p.content.contains("[line cut: 10000 bytes]"));
        assert_eq!(p.cut, 1);
        assert!(p.content.len() < 2100);
    }

    #[test]
    fn a_page_of_long_lines_stops_at_the_page_cap_and_the_next_goes_on_from_there() {
        let text = format!("{}\n", "y".repeat(1_990)).repeat(5_000);
        let p = page(&text, 1, 5_000);
        assert!(
            p.content.len() <= MAX_AGENT_PAGE_BYTES + 2_100,
            "{}",
            p.content.len()
        );
        assert!(p.returned > 400 && p.returned < 600, "{}", p.returned);
        assert_eq!(p.total_lines, 5_000);
        let next = page(&text, 1 + p.returned, 5_000);
        assert!(next.content.starts_with(&format!("{:>6}|", 1 + p.returned)));
    }

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<ReadFileArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to read, absolute or relative to the working directory"},
                    "offset": {"type": "integer", "default": 1, "minimum": 1, "description": "First line to return (1-based)"},
                    "limit": {"type": "integer", "default": 500, "minimum": 1, "maximum": MAX_LIMIT, "description": "Most lines to return"}
                },
                "required": ["path"]
            }),
            json!({"path": "src/main.rs", "offset": 10, "limit": 50}),
            json!({"path": ["not", "a", "string"]}),
        );
    }
}
