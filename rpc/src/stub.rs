//! Generation of `vibeos_tools.py`, the module a script imports its tools from.
//!
//! The module imports a fixed runtime (the channel, `json_parse`, `shell_quote`, `retry`; see
//! `stub_runtime.py` beside this file), which is written beside it as [`RUNTIME_FILE`], and
//! then defines one function per tool, written from the tool's JSON schema so that the script
//! sees the real signature, defaults and doc line. The runtime is a module of its own because
//! it is the same for every execution: a fork server imports it before it forks, so a forked
//! script compiles only its wrappers (the runtime was four fifths of the stub's compile time).

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Source of the runtime module every generated stub imports from.
pub const RUNTIME_SOURCE: &str = include_str!("stub_runtime.py");

/// The runtime's module name.
pub const RUNTIME_MODULE: &str = "_vibeos_runtime";

/// The runtime's file, written beside `vibeos_tools.py` in every staging dir.
pub const RUNTIME_FILE: &str = "_vibeos_runtime.py";

/// The generated module's head: its doc and what it takes from the runtime. The wrappers call
/// `_call` and `_drop_unset`, parse non-scalar defaults with `_json`, and accept schema names
/// that are not identifiers through `_wire_names`, each under a [`INTERNAL_PREFIX`] name: a
/// function body looks names up among its parameters first, and no parameter can take such a
/// name ([`param_ident`]), so a schema property called `_call` cannot shadow the channel.
const HEAD: &str = r#""""Tools of this execute_code run, callable from the script.

Generated for one execution. Each tool function sends one call over the execution's private
channel to the supervisor and returns the tool's parsed result. A tool that fails returns a dict
with an "error" key; only a broken or refused channel raises ToolChannelError.

The module is safe to use from several threads at once (calls are multiplexed by id over one
connection) and from forked children and subprocesses (each process opens its own connection).
"""

from _vibeos_runtime import ToolChannelError, json_parse, shell_quote, retry  # noqa: F401
from _vibeos_runtime import _call as _vibeos_call, _drop_unset as _vibeos_drop_unset  # noqa: F401
from _vibeos_runtime import _json as _vibeos_json, _wire_names as _vibeos_wire_names  # noqa: F401
"#;

/// Prefix of every name the generated wrappers use besides their parameters (see [`HEAD`]).
/// A parameter whose Python name would start with it is renamed (a trailing `_`).
const INTERNAL_PREFIX: &str = "_vibeos_";

/// Helper names the runtime defines; a tool may not shadow them.
const HELPERS: [&str; 4] = ["json_parse", "shell_quote", "retry", "ToolChannelError"];

/// Python keywords (3.8 to 3.13) that cannot be used as parameter names, and `__debug__`,
/// which is not a keyword but cannot be assigned either (`def f(__debug__=None)` is a
/// SyntaxError). Soft keywords (`match`, `case`, `type`, `_`) are usable names.
const PY_KEYWORDS: [&str; 36] = [
    "False",
    "None",
    "True",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "class",
    "continue",
    "def",
    "del",
    "elif",
    "else",
    "except",
    "finally",
    "for",
    "from",
    "global",
    "if",
    "import",
    "in",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "return",
    "try",
    "while",
    "with",
    "yield",
    "__debug__",
];

/// The public names of Python's `builtins` (3.8 to 3.13, keywords aside). A tool named like
/// one would replace it in a script that imports it (the execute_code description lists every
/// tool to import): an MCP server's tool named `print` received everything the script printed
/// instead of the model, and one named `open` or `len` would see the script's files and data.
const PY_BUILTINS: [&str; 147] = [
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "BaseExceptionGroup",
    "BlockingIOError",
    "BrokenPipeError",
    "BufferError",
    "BytesWarning",
    "ChildProcessError",
    "ConnectionAbortedError",
    "ConnectionError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "DeprecationWarning",
    "EOFError",
    "Ellipsis",
    "EncodingWarning",
    "EnvironmentError",
    "Exception",
    "ExceptionGroup",
    "FileExistsError",
    "FileNotFoundError",
    "FloatingPointError",
    "FutureWarning",
    "GeneratorExit",
    "IOError",
    "ImportError",
    "ImportWarning",
    "IndentationError",
    "IndexError",
    "InterruptedError",
    "IsADirectoryError",
    "KeyError",
    "KeyboardInterrupt",
    "LookupError",
    "MemoryError",
    "ModuleNotFoundError",
    "NameError",
    "NotADirectoryError",
    "NotImplemented",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PendingDeprecationWarning",
    "PermissionError",
    "ProcessLookupError",
    "PythonFinalizationError",
    "RecursionError",
    "ReferenceError",
    "ResourceWarning",
    "RuntimeError",
    "RuntimeWarning",
    "StopAsyncIteration",
    "StopIteration",
    "SyntaxError",
    "SyntaxWarning",
    "SystemError",
    "SystemExit",
    "TabError",
    "TimeoutError",
    "TypeError",
    "UnboundLocalError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "UnicodeError",
    "UnicodeTranslateError",
    "UnicodeWarning",
    "UserWarning",
    "ValueError",
    "Warning",
    "ZeroDivisionError",
    "abs",
    "aiter",
    "all",
    "anext",
    "any",
    "ascii",
    "bin",
    "bool",
    "breakpoint",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "compile",
    "complex",
    "copyright",
    "credits",
    "delattr",
    "dict",
    "dir",
    "divmod",
    "enumerate",
    "eval",
    "exec",
    "exit",
    "filter",
    "float",
    "format",
    "frozenset",
    "getattr",
    "globals",
    "hasattr",
    "hash",
    "help",
    "hex",
    "id",
    "input",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "license",
    "list",
    "locals",
    "map",
    "max",
    "memoryview",
    "min",
    "next",
    "object",
    "oct",
    "open",
    "ord",
    "pow",
    "print",
    "property",
    "quit",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "setattr",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "vars",
    "zip",
];

/// What the generator needs to know of one tool.
///
/// Every text here may come from an MCP server the operator opened to scripts, so none of it
/// is trusted: the name must pass [`check_tool_name`], and descriptions, property names,
/// defaults and types are only ever written into the module as escaped string literals, which
/// no input can end early.
#[derive(Debug, Clone, PartialEq)]
pub struct StubTool {
    /// Tool name; becomes the Python function name.
    pub name: String,
    /// Description; its [`doc_line`] becomes the doc line, the rest the docstring's body.
    pub description: String,
    /// JSON schema of the arguments (`{"type": "object", "properties": …, "required": …}`).
    pub parameters: Value,
}

/// Why a tool was left out of the stub.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StubError {
    /// The tool name is not a usable Python identifier.
    #[error("tool `{0}` was left out of vibeos_tools: its name is not a Python identifier")]
    BadToolName(String),
    /// The tool name would shadow a helper of the stub.
    #[error("tool `{0}` was left out of vibeos_tools: the name is taken by a stub helper")]
    ShadowsHelper(String),
    /// The tool name is one of Python's builtins (`print`, `open`, `len`).
    #[error(
        "tool `{0}` was left out of vibeos_tools: the name is a Python builtin, which the tool \
         would replace in a script that imports it"
    )]
    ShadowsBuiltin(String),
    /// The schema's `properties` is not an object.
    #[error(
        "tool `{0}` was left out of vibeos_tools: its parameter schema has no properties object"
    )]
    BadSchema(String),
}

/// The generated module and the tools that could not be included.
#[derive(Debug, Clone)]
pub struct GeneratedStub {
    /// Source of `vibeos_tools.py`.
    pub source: String,
    /// Names of the tools included, in order.
    pub tools: Vec<String>,
    /// Tools left out, each with the reason.
    pub skipped: Vec<StubError>,
}

/// Generates `vibeos_tools.py` for the given tools. With no tools, the module has only its
/// helpers (the execution's allowlist failed closed).
pub fn generate_stub(tools: &[StubTool]) -> GeneratedStub {
    let mut source = String::with_capacity(HEAD.len() + tools.len() * 600);
    source.push_str(HEAD);
    let mut included = Vec::new();
    let mut skipped = Vec::new();
    for tool in tools {
        match render_tool(tool) {
            Ok(code) => {
                source.push_str("\n\n");
                source.push_str(&code);
                included.push(tool.name.clone());
            }
            Err(e) => skipped.push(e),
        }
    }
    let mut all: Vec<String> = included.iter().map(|n| py_str(n)).collect();
    all.extend(HELPERS.iter().map(|h| py_str(h)));
    let _ = write!(
        source,
        "\n\n__all__ = [{}]\n_TOOLS = ({})\n\n\ndef __getattr__(name):\n    raise AttributeError(\n        \"vibeos_tools has no tool %r in this execution; available: %s\"\n        % (name, \", \".join(_TOOLS) or \"none (no script tool is enabled)\")\n    )\n",
        all.join(", "),
        included
            .iter()
            .map(|n| format!("{}, ", py_str(n)))
            .collect::<String>()
    );
    GeneratedStub {
        source,
        tools: included,
        skipped,
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A Python parameter name for a schema property: characters other than ASCII letters and
/// digits become `_`; keywords and names the wrapper's body uses ([`INTERNAL_PREFIX`]) get a
/// trailing `_`; then `_` until no other parameter has it. The wire still uses the original
/// name.
fn param_ident(name: &str, taken: &mut BTreeSet<String>) -> String {
    let mut ident = plain_ident(name);
    while !taken.insert(ident.clone()) {
        ident.push('_');
    }
    ident
}

/// [`param_ident`] before it is made unique.
fn plain_ident(name: &str) -> String {
    let mut ident: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if ident.is_empty() || ident.starts_with(|c: char| c.is_ascii_digit()) {
        ident.insert(0, '_');
    }
    if PY_KEYWORDS.contains(&ident.as_str())
        || ident.starts_with("_args")
        || ident.starts_with(INTERNAL_PREFIX)
    {
        ident.push('_');
    }
    ident
}

/// A Python literal for a JSON scalar default; `None` for arrays and objects, which must not be
/// shared mutable defaults and are filled in inside the function instead.
fn py_scalar(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_str(s),
        Value::Array(_) | Value::Object(_) => return None,
    })
}

/// `s` as a double-quoted Python string literal (see [`py_escape`]).
fn py_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    py_escape(&mut out, s);
    out.push('"');
    out
}

/// Appends `s` escaped for the inside of a non-raw Python string literal, `"` or `"""`
/// delimited. The result holds no `"` and no `\` that is not part of an escape this function
/// wrote, so the tokenizer, which reads `\` and the character after it as one unit, finds no
/// quote that could end the literal: whatever `s` holds (quotes at its end, `"""`, a
/// backslash at its end), the literal ends where the generator closes it. It holds no line
/// break either (not even `\r`, U+2028 or U+0085, which some readers of the source treat as
/// one), no NUL (which Python refuses anywhere in source) and no other control or invisible
/// formatting character (bidirectional overrides could make the source read differently from
/// what it is). Every escape written is one Python knows (`\\`, `\"`, `\n`, `\r`, `\t`,
/// `\xNN`, `\uNNNN`, `\UNNNNNNNN`), so the value reads back exactly as `s`.
fn py_escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let n = c as u32;
                let _ = if n <= 0xff {
                    write!(out, "\\x{n:02x}")
                } else if n <= 0xffff {
                    write!(out, "\\u{n:04x}")
                } else {
                    write!(out, "\\U{n:08x}")
                };
            }
            c => out.push(c),
        }
    }
}

/// Characters written as escapes rather than as themselves: the C0 and C1 controls and DEL,
/// the Unicode line and paragraph separators, and the invisible format characters (zero-width
/// ones, bidirectional marks, embeddings, overrides and isolates, the BOM, interlinear
/// annotation marks). Unassigned and private-use characters are left as they are: they are
/// visible as what they are in any editor and mean nothing to the tokenizer.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{61c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// Text safe inside a `"""` docstring: escaped as any string literal is ([`py_escape`]); the
/// generator writes the docstring's line breaks itself, between escaped lines.
fn doc_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    py_escape(&mut out, s);
    out
}

/// The doc line of a tool's description: its first line that is not blank, trimmed; empty when
/// the description is blank. Lines end where Python's `str.splitlines()` ends them (`\r`,
/// U+2028 and the other separators too, not only `\n`). The stub's docstring starts with it
/// and the execute_code description shows it beside the tool's signature, so both say the same.
pub fn doc_line(description: &str) -> &str {
    py_lines(description)
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// The lines of `s` as Python's `str.splitlines()` cuts them: at `\n`, `\r`, `\r\n`, `\x0b`,
/// `\x0c`, `\x1c`–`\x1e`, U+0085, U+2028 and U+2029, without the breaks.
fn py_lines(s: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.find(|c: char| {
            matches!(
                c,
                '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}'
                    ..='\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
            )
        }) {
            Some(i) => {
                let after = &text[i..];
                let skip = if after.starts_with("\r\n") {
                    2
                } else {
                    after.chars().next().map_or(1, char::len_utf8)
                };
                let next = &text[i + skip..];
                rest = (!next.is_empty()).then_some(next);
                Some(&text[..i])
            }
            None => {
                rest = None;
                (!text.is_empty()).then_some(text)
            }
        }
    })
}

fn type_label(schema: &Value) -> String {
    match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" | "),
        _ => "any".into(),
    }
}

/// One parameter of a tool's function in `vibeos_tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct StubParam {
    /// The property name in the tool's schema: what the call sends.
    pub wire: String,
    /// The Python parameter name: `wire` made an identifier (`class` → `class_`,
    /// `a-b` → `a_b`), unique within the function.
    pub ident: String,
    /// Whether the schema requires it (then it has no default).
    pub required: bool,
    /// The schema's `default`, when it has one.
    pub default: Option<Value>,
}

/// Whether a tool called `name` can be a function of `vibeos_tools`: a Python identifier that
/// is not a keyword, a builtin, a stub helper or private (`_`-prefixed). Part of [`stub_function`], for
/// callers that have a name but no schema yet (opening a tool to scripts before it exists).
pub fn check_tool_name(name: &str) -> Result<(), StubError> {
    if !is_identifier(name) || PY_KEYWORDS.contains(&name) {
        return Err(StubError::BadToolName(name.to_string()));
    }
    if HELPERS.contains(&name) || name.starts_with('_') {
        return Err(StubError::ShadowsHelper(name.to_string()));
    }
    if PY_BUILTINS.contains(&name) {
        return Err(StubError::ShadowsBuiltin(name.to_string()));
    }
    Ok(())
}

/// The function [`generate_stub`] writes for tool `name` with argument schema `parameters`:
/// its parameters in signature order (required ones in the schema's `required` order, then the
/// optional ones in property order), or why the tool is left out of the module.
///
/// This is the one rule for which tools a script can import: the registry lists, allows and
/// describes exactly the tools for which it is `Ok`, with these parameter names.
pub fn stub_function(name: &str, parameters: &Value) -> Result<Vec<StubParam>, StubError> {
    check_tool_name(name)?;
    let empty = Map::new();
    let props = match parameters.get("properties") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err(StubError::BadSchema(name.to_string())),
    };
    let required: Vec<&str> = parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();

    // A property whose name is already a usable Python name keeps it, whatever order the
    // schema lists it in: `a_b` is `a_b`, and `a-b` beside it becomes `a_b_`, not the other way
    // round (a call `f(a_b=…)` must reach the property named `a_b`).
    let exact: BTreeSet<String> = props
        .keys()
        .filter(|n| plain_ident(n) == **n)
        .cloned()
        .collect();
    let mut taken = exact.clone();
    let mut params = Vec::with_capacity(props.len());
    let mut param = |wire: &str, schema: &Value, required: bool| StubParam {
        wire: wire.to_string(),
        ident: if exact.contains(wire) {
            wire.to_string()
        } else {
            param_ident(wire, &mut taken)
        },
        required,
        default: if required {
            None
        } else {
            schema.get("default").cloned()
        },
    };
    for wire in required.iter().filter(|n| props.contains_key(**n)) {
        if let Some(schema) = props.get(*wire) {
            params.push(param(wire, schema, true));
        }
    }
    for (wire, schema) in props {
        if !required.contains(&wire.as_str()) {
            params.push(param(wire, schema, false));
        }
    }
    Ok(params)
}

/// `path, offset=1, globs=["*"], q=None`: the parameter list of a [`stub_function`], with
/// the stub's Python names. Scalar defaults are the stub's literals; array and object defaults
/// (`None` in the stub's signature, filled in inside the function) are shown as their JSON
/// value, which is what the call then sends.
pub fn signature_text(params: &[StubParam]) -> String {
    params
        .iter()
        .map(|p| {
            if p.required {
                return p.ident.clone();
            }
            let default = match &p.default {
                None => "None".to_string(),
                Some(v) => py_scalar(v).unwrap_or_else(|| v.to_string()),
            };
            format!("{}={default}", p.ident)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn render_tool(tool: &StubTool) -> Result<String, StubError> {
    let params = stub_function(&tool.name, &tool.parameters)?;
    let no_schema = Value::Null;
    let schema_of = |p: &StubParam| {
        tool.parameters
            .get("properties")
            .and_then(|props| props.get(&p.wire))
            .unwrap_or(&no_schema)
    };

    let mut sig = Vec::new();
    let mut fill_defaults = String::new();
    let mut drop_if_unset = Vec::new();
    for p in &params {
        if p.required {
            sig.push(p.ident.clone());
            continue;
        }
        match &p.default {
            Some(default) => match py_scalar(default) {
                Some(lit) => sig.push(format!("{}={}", p.ident, lit)),
                None => {
                    sig.push(format!("{}=None", p.ident));
                    let json = serde_json::to_string(default).unwrap_or_else(|_| "null".into());
                    let _ = writeln!(
                        fill_defaults,
                        "    if {id} is None:\n        {id} = _vibeos_json.loads({lit})",
                        id = p.ident,
                        lit = py_str(&json)
                    );
                }
            },
            None => {
                sig.push(format!("{}=None", p.ident));
                drop_if_unset.push(py_str(&p.wire));
            }
        }
    }

    // The docstring: the doc line, then the description's other lines as they are (trailing
    // space and blank lines at either end dropped), each escaped on its own; the line breaks
    // between them are the only ones the generator writes.
    let mut doc = String::new();
    let summary = doc_line(&tool.description);
    if summary.is_empty() {
        doc.push_str("Call the tool.");
    } else {
        let mut lines: Vec<&str> = py_lines(&tool.description)
            .skip_while(|l| l.trim().is_empty())
            .skip(1)
            .map(str::trim_end)
            .collect();
        while lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        doc.push_str(&doc_text(summary));
        for line in lines {
            doc.push_str("\n    ");
            doc.push_str(&doc_text(line));
        }
    }
    if !params.is_empty() {
        doc.push_str("\n\n    Args:\n");
        for p in &params {
            let desc = schema_of(p)
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                doc,
                "        {} ({}{}){}{}",
                p.ident,
                doc_text(&type_label(schema_of(p))),
                if p.required { ", required" } else { "" },
                if desc.is_empty() { "" } else { ": " },
                doc_text(&desc)
            );
        }
        doc.push_str("    ");
    }

    let args_dict = params
        .iter()
        .map(|p| format!("{}: {}", py_str(&p.wire), p.ident))
        .collect::<Vec<_>>()
        .join(", ");
    let mut code = String::new();
    // A schema name that is not an identifier (`class`, `a-b`) is a parameter under another
    // name; the decorator also accepts the schema's own name as a keyword
    // (`tool(**{"class": 1})`), so code written against the schema works too. A schema name
    // that is also another parameter's Python name keeps meaning that parameter.
    let renamed: Vec<String> = params
        .iter()
        .filter(|p| p.wire != p.ident && !params.iter().any(|q| q.ident == p.wire))
        .map(|p| format!("({}, {}), ", py_str(&p.wire), py_str(&p.ident)))
        .collect();
    if !renamed.is_empty() {
        let _ = writeln!(code, "@_vibeos_wire_names(({}))", renamed.concat());
    }
    let _ = writeln!(code, "def {}({}):", tool.name, sig.join(", "));
    let _ = writeln!(code, "    \"\"\"{doc}\"\"\"");
    code.push_str(&fill_defaults);
    if drop_if_unset.is_empty() {
        let _ = writeln!(
            code,
            "    return _vibeos_call({}, {{{}}})",
            py_str(&tool.name),
            args_dict
        );
    } else {
        let _ = writeln!(
            code,
            "    return _vibeos_call({}, _vibeos_drop_unset({{{}}}, ({},)))",
            py_str(&tool.name),
            args_dict,
            drop_if_unset.join(", ")
        );
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, params: Value) -> StubTool {
        StubTool {
            name: name.into(),
            description: "Read a file.\nSecond line.".into(),
            parameters: params,
        }
    }

    #[test]
    fn writes_real_signatures_with_defaults() {
        let stub = generate_stub(&[tool(
            "read_file",
            json!({"type": "object", "properties": {
                "offset": {"type": "integer", "default": 1},
                "path": {"type": "string", "description": "File to read"},
                "limit": {"type": "integer", "default": 500},
                "globs": {"type": "array", "default": ["*"]},
                "mode": {"type": "string"},
                "from": {"type": "string"}
            }, "required": ["path"]}),
        )]);
        assert!(stub.skipped.is_empty());
        assert!(
            stub.source.contains(
                "def read_file(path, offset=1, limit=500, globs=None, mode=None, from_=None):"
            ),
            "{}",
            stub.source
        );
        assert!(stub.source.contains("\"from\": from_"));
        assert!(stub
            .source
            .contains("path (string, required): File to read"));
        assert!(stub
            .source
            .contains("globs = _vibeos_json.loads(\"[\\\"*\\\"]\")"));
        assert!(stub.source.contains("_vibeos_drop_unset("));
    }

    #[test]
    fn leaves_out_unusable_tools_with_a_reason() {
        let stub = generate_stub(&[
            tool("bad-name", json!({})),
            tool("retry", json!({})),
            tool("odd", json!({"properties": 3})),
            tool("fine", json!({})),
        ]);
        assert_eq!(stub.tools, vec!["fine".to_string()]);
        assert_eq!(stub.skipped.len(), 3);
        assert!(stub.source.contains("def fine():"));
    }

    #[test]
    fn an_empty_tool_list_gives_helpers_only() {
        let stub = generate_stub(&[]);
        assert!(stub.tools.is_empty());
        assert!(stub.source.contains(
            "from _vibeos_runtime import ToolChannelError, json_parse, shell_quote, retry"
        ));
        assert!(RUNTIME_SOURCE.contains("def retry("));
        assert!(stub.source.contains("_TOOLS = ()"));
    }

    #[test]
    fn the_runtime_refuses_calls_by_the_supervisors_frame_limit() {
        // The stub refuses arguments the supervisor would close the channel over; the two
        // limits are one number written twice.
        assert!(
            RUNTIME_SOURCE.contains(&format!("_MAX_FRAME_BYTES = {}\n", crate::MAX_FRAME_BYTES))
        );
    }

    #[test]
    fn the_runtime_defines_every_name_the_stub_takes_from_it() {
        let head = HEAD
            .lines()
            .filter_map(|l| l.strip_prefix("from _vibeos_runtime import "));
        for line in head {
            let names = line.split('#').next().unwrap_or_default();
            // `_call as _vibeos_call`: the runtime defines the name before `as`.
            let imported = names
                .split(',')
                .filter_map(|n| n.split(" as ").next())
                .map(str::trim);
            for name in imported.filter(|n| !n.is_empty()) {
                let defined = [
                    format!("def {name}("),
                    format!("class {name}("),
                    format!("{name} = "),
                ];
                assert!(
                    defined.iter().any(|d| RUNTIME_SOURCE.contains(d.as_str())),
                    "the runtime does not define {name}"
                );
            }
        }
        assert_eq!(RUNTIME_FILE, format!("{RUNTIME_MODULE}.py"));
    }

    #[test]
    fn docstrings_cannot_be_broken_out_of() {
        let mut t = tool("x", json!({}));
        t.description = "ends here \"\"\" and \\ more".into();
        let stub = generate_stub(&[t]);
        assert!(stub.source.contains("ends here \\\"\\\"\\\" and \\\\ more"));
    }

    #[test]
    fn the_doc_line_is_the_first_line_that_is_not_blank() {
        assert_eq!(doc_line("\n\n  Real first line\nsecond"), "Real first line");
        assert_eq!(doc_line(" \r\n\u{2028}a\rb"), "a");
        assert_eq!(doc_line(" \n\t "), "");
        assert_eq!(
            py_lines("a\r\nb\rc\u{2028}\n\u{85}d\n").collect::<Vec<_>>(),
            ["a", "b", "c", "", "", "d"]
        );
        let mut t = tool("x", json!({}));
        t.description = "\n\n  Real first line\nsecond  \n\n".into();
        let stub = generate_stub(&[t]);
        assert!(
            stub.source
                .contains("def x():\n    \"\"\"Real first line\n    second\"\"\"\n"),
            "{}",
            stub.source
        );
    }

    #[test]
    fn parameters_never_take_the_names_the_wrapper_uses() {
        let schema = json!({"type": "object", "properties": {
            "_call": {"type": "string"},
            "_json": {"type": "string"},
            "_vibeos_call": {"type": "string"},
            "__debug__": {"type": "string"}
        }});
        let params = stub_function("k", &schema).unwrap();
        let idents: Vec<&str> = params.iter().map(|p| p.ident.as_str()).collect();
        assert_eq!(idents, ["_call", "_json", "_vibeos_call_", "__debug___"]);
        // Every name the head binds for the wrappers is one no parameter can take.
        for line in HEAD
            .lines()
            .filter(|l| l.starts_with("from _vibeos_runtime import _"))
        {
            for alias in line.split(" as ").skip(1) {
                let name = alias.split([',', ' ']).next().unwrap_or_default();
                assert!(name.starts_with(INTERNAL_PREFIX), "{name}");
            }
        }
    }

    #[test]
    fn string_literals_escape_everything_that_could_end_or_break_them() {
        assert_eq!(
            py_str("a\"\\\0\r\u{2028}\u{202e}\u{85}\u{7f}é☃\u{1f600}"),
            "\"a\\\"\\\\\\x00\\r\\u2028\\u202e\\x85\\x7fé☃\u{1f600}\""
        );
    }

    #[test]
    fn schema_names_that_are_not_identifiers_keep_their_wire_name() {
        let schema = json!({"type": "object", "properties": {
            "class": {"type": "string"},
            "a-b": {"type": "integer", "default": 2},
            "class_": {"type": "string"}
        }, "required": ["class"]});
        let params = stub_function("k", &schema).unwrap();
        let idents: Vec<&str> = params.iter().map(|p| p.ident.as_str()).collect();
        // `class_` is a usable name of its own and keeps it; `class` gets the next free one.
        assert_eq!(idents, ["class__", "a_b", "class_"]);
        assert_eq!(signature_text(&params), "class__, a_b=2, class_=None");
        let stub = generate_stub(&[tool("k", schema)]);
        assert!(
            stub.source.contains("def k(class__, a_b=2, class_=None):"),
            "{}",
            stub.source
        );
        // `class` and `a-b` are also accepted under their own names; `class_` is a parameter
        // of its own, so it is not renamed.
        assert!(
            stub.source
                .contains("@_vibeos_wire_names(((\"class\", \"class__\"), (\"a-b\", \"a_b\"), ))"),
            "{}",
            stub.source
        );
        assert!(RUNTIME_SOURCE.contains("def _wire_names("));
    }

    #[test]
    fn a_property_named_like_a_python_name_keeps_it_beside_one_renamed_to_it() {
        // Stop 50's probe: `a-b` listed first took `a_b`, so `f(a_b=…)` sent `{"a-b": …}`.
        let params = stub_function(
            "coll",
            &json!({"type": "object", "properties": {
                "a-b": {"type": "string"}, "a_b": {"type": "string"},
                "if": {"type": "string"}, "if_": {"type": "string"}}}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let ident = |wire: &str| {
            params
                .iter()
                .find(|p| p.wire == wire)
                .map(|p| p.ident.clone())
                .unwrap_or_default()
        };
        assert_eq!(ident("a_b"), "a_b");
        assert_eq!(ident("if_"), "if_");
        assert_ne!(ident("a-b"), "a_b");
        assert_ne!(ident("if"), "if_");
        let mut names: Vec<String> = params.iter().map(|p| p.ident.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4, "{params:?}");
    }

    #[test]
    fn the_name_rule_is_the_stubs() {
        for bad in [
            "with-dash",
            "1abc",
            "class",
            "json_parse",
            "retry",
            "_private",
            // Builtins: a tool named `print` got what the script printed.
            "print",
            "open",
            "len",
            "ValueError",
            "anext",
        ] {
            assert!(check_tool_name(bad).is_err(), "{bad}");
            assert!(stub_function(bad, &json!({})).is_err(), "{bad}");
            assert!(
                generate_stub(&[tool(bad, json!({}))]).tools.is_empty(),
                "{bad}"
            );
        }
        assert!(check_tool_name("fine_1").is_ok());
        assert_eq!(
            signature_text(
                &stub_function(
                    "t",
                    &json!({"properties": {
                        "g": {"type": "array", "default": ["*"]},
                        "s": {"type": "string", "default": "a\"b"},
                        "f": {"type": "boolean", "default": true}
                    }})
                )
                .unwrap()
            ),
            "g=[\"*\"], s=\"a\\\"b\", f=True"
        );
    }
}
