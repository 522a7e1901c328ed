//! A tool call's answer as the registry returns it: the MCP result turned into JSON, and the
//! error that stands for a response too large to receive.

use super::stdio;
use crate::ToolError;
use rmcp::model::CallToolResult;
use serde_json::Value;

/// The limit a response broke, when `e` is the error [`stdio::LineGuard`] answers a too-large
/// response with.
pub(super) fn too_large(e: &rmcp::ServiceError) -> Option<u64> {
    match e {
        rmcp::ServiceError::McpError(data) => {
            data.data.as_ref()?.get(stdio::TOO_LARGE_KEY)?.as_u64()
        }
        _ => None,
    }
}

/// The tool's answer as JSON: its structured content when it gave one, else its text (parsed
/// when it is JSON), else all its content blocks. An error result is a tool error.
pub(super) fn result_value(
    label: &str,
    tool: &str,
    result: CallToolResult,
) -> Result<Value, ToolError> {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if result.is_error == Some(true) {
        return Err(ToolError::new(
            crate::ToolErrorKind::McpToolError,
            // Bounded like an error answer (`call_error_text`): a model reads it.
            super::bounded_text(
                format!(
                    "`{tool}` of {label} reported an error: {}",
                    texts.join("\n")
                ),
                super::MAX_ERROR_TEXT,
            ),
        ));
    }
    if let Some(v) = result.structured_content {
        return Ok(v);
    }
    if result.content.len() == 1 && texts.len() == 1 {
        return Ok(serde_json::from_str::<Value>(texts[0])
            .unwrap_or_else(|_| serde_json::json!({ "result": texts[0] })));
    }
    let blocks = serde_json::to_value(&result.content).unwrap_or(Value::Null);
    Ok(serde_json::json!({ "content": blocks }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's `isError` text is cut like its error answers (stop 56's probe: a 1 MB
    /// `isError` result reached the model whole, while a 1 MB JSON-RPC error was cut).
    #[test]
    fn an_error_result_is_cut_like_an_error_answer() {
        let big = "e".repeat(1_000_000);
        let result = CallToolResult::error(vec![rmcp::model::ContentBlock::text(big)]);
        let Err(e) = result_value("MCP server `w`", "bigerr", result) else {
            panic!("an error result is a tool error");
        };
        assert!(e
            .message
            .starts_with("`bigerr` of MCP server `w` reported an error: eee"));
        assert!(
            e.message.len() < super::super::MAX_ERROR_TEXT + 200,
            "{}",
            e.message.len()
        );
        let small = CallToolResult::error(vec![rmcp::model::ContentBlock::text("no such row")]);
        let Err(e) = result_value("MCP server `w`", "q", small) else {
            panic!("an error result is a tool error");
        };
        assert_eq!(
            e.message,
            "`q` of MCP server `w` reported an error: no such row"
        );
    }
}
