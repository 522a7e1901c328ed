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

/// The generated module's head: its doc and what it takes from the runtime (the wrappers call
/// `_call` and `_drop_unset`, parse non-scalar defaults with `_json`, and accept schema names
/// that are not identifiers through `_wire_names`).
const HEAD: &str = r#""""Tools of this execute_code run, callable from the script.

Generated for one execution. Each tool function sends one call over the execution's private
channel to the supervisor and returns the tool's parsed result. A tool that fails returns a dict
with an "error" key; only a broken or refused channel raises ToolChannelError.

The module is safe to use from several threads at once (calls are multiplexed by id over one
connection) and from forked children and subprocesses (each process opens its own connection).
"""

from _vibeos_runtime import ToolChannelError, json_parse, shell_quote, retry  # noqa: F401
from _vibeos_runtime import _call, _drop_unset, _json, _wire_names  # noqa: F401
"#;

/// Helper names the runtime defines; a tool may not shadow them.
const HELPERS: [&str; 4] = ["json_parse", "shell_quote", "retry", "ToolChannelError"];

/// Python keywords (3.8 to 3.13) that cannot be used as parameter names.
const PY_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// What the generator needs to know of one tool.
#[derive(Debug, Clone, PartialEq)]
pub struct StubTool {
    /// Tool name; becomes the Python function name.
    pub name: String,
    /// Description; its first line becomes the doc line.
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
    let mut all: Vec<String> = included.iter().map(|n| format!("{n:?}")).collect();
    all.extend(HELPERS.iter().map(|h| format!("{h:?}")));
    let _ = write!(
        source,
        "\n\n__all__ = [{}]\n_TOOLS = ({})\n\n\ndef __getattr__(name):\n    raise AttributeError(\n        \"vibeos_tools has no tool %r in this execution; available: %s\"\n        % (name, \", \".join(_TOOLS) or \"none (no script tool is enabled)\")\n    )\n",
        all.join(", "),
        included
            .iter()
            .map(|n| format!("{n:?}, "))
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

/// A Python parameter name for a schema property: keywords get a trailing `_`, other
/// characters become `_`; the wire still uses the original name.
fn param_ident(name: &str, taken: &mut BTreeSet<String>) -> String {
    let mut ident: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if ident.is_empty() || ident.starts_with(|c: char| c.is_ascii_digit()) {
        ident.insert(0, '_');
    }
    if PY_KEYWORDS.contains(&ident.as_str()) || ident.starts_with("_args") {
        ident.push('_');
    }
    while !taken.insert(ident.clone()) {
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

fn py_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text safe inside a `"""` docstring.
fn doc_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace("\"\"\"", "\\\"\\\"\\\"")
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
/// is not a keyword, a stub helper or private (`_`-prefixed). Part of [`stub_function`], for
/// callers that have a name but no schema yet (opening a tool to scripts before it exists).
pub fn check_tool_name(name: &str) -> Result<(), StubError> {
    if !is_identifier(name) || PY_KEYWORDS.contains(&name) {
        return Err(StubError::BadToolName(name.to_string()));
    }
    if HELPERS.contains(&name) || name.starts_with('_') {
        return Err(StubError::ShadowsHelper(name.to_string()));
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

    let mut taken = BTreeSet::new();
    let mut params = Vec::with_capacity(props.len());
    let mut param = |wire: &str, schema: &Value, required: bool| StubParam {
        wire: wire.to_string(),
        ident: param_ident(wire, &mut taken),
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
                        "    if {id} is None:\n        {id} = _json.loads({lit})",
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

    let mut doc = String::new();
    let summary = tool.description.trim();
    let summary = if summary.is_empty() {
        "Call the tool."
    } else {
        summary
    };
    doc.push_str(
        &summary
            .lines()
            .map(|l| doc_text(l.trim_end()))
            .collect::<Vec<_>>()
            .join("\n    "),
    );
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
        let _ = writeln!(code, "@_wire_names(({}))", renamed.concat());
    }
    let _ = writeln!(code, "def {}({}):", tool.name, sig.join(", "));
    let _ = writeln!(code, "    \"\"\"{doc}\"\"\"");
    code.push_str(&fill_defaults);
    if drop_if_unset.is_empty() {
        let _ = writeln!(
            code,
            "    return _call({}, {{{}}})",
            py_str(&tool.name),
            args_dict
        );
    } else {
        let _ = writeln!(
            code,
            "    return _call({}, _drop_unset({{{}}}, ({},)))",
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
        assert!(stub.source.contains("globs = _json.loads(\"[\\\"*\\\"]\")"));
        assert!(stub.source.contains("_drop_unset("));
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
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
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
    fn schema_names_that_are_not_identifiers_keep_their_wire_name() {
        let schema = json!({"type": "object", "properties": {
            "class": {"type": "string"},
            "a-b": {"type": "integer", "default": 2},
            "class_": {"type": "string"}
        }, "required": ["class"]});
        let params = stub_function("k", &schema).unwrap();
        let idents: Vec<&str> = params.iter().map(|p| p.ident.as_str()).collect();
        assert_eq!(idents, ["class_", "a_b", "class__"]);
        assert_eq!(signature_text(&params), "class_, a_b=2, class__=None");
        let stub = generate_stub(&[tool("k", schema)]);
        assert!(
            stub.source.contains("def k(class_, a_b=2, class__=None):"),
            "{}",
            stub.source
        );
        // `class` and `a-b` are also accepted under their own names; `class_` is a parameter
        // of its own, so it is not renamed.
        assert!(
            stub.source
                .contains("@_wire_names(((\"class\", \"class_\"), (\"a-b\", \"a_b\"), ))"),
            "{}",
            stub.source
        );
        assert!(RUNTIME_SOURCE.contains("def _wire_names("));
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
