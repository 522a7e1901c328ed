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
            format!(
                "`{tool}` of {label} reported an error: {}",
                texts.join("\n")
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
