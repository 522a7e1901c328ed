//! Schemas of the agent-loop tools: `todo`, `memory`, `session_search`, `delegate_task`.
//!
//! The agent loop answers these itself (they need its conversation state), so dispatch refuses
//! them ([`crate::AGENT_LOOP_TOOLS`]). Their schemas still belong in the registry: platform
//! presets such as `vibeos-cli` name their toolsets, and a preset that resolved to nothing would
//! hide them from the model. The handlers below are never reached through
//! `handle_function_call`; they refuse too, for a caller that dispatches directly.

use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};

fn refuse(
    name: &'static str,
) -> impl Fn(&Map<String, Value>, &ToolContext) -> Result<Value, ToolError> {
    move |_, _| {
        Err(ToolError::new(
            crate::ToolErrorKind::AgentLoopTool,
            format!("`{name}` is handled by the agent loop and cannot be dispatched as a tool"),
        ))
    }
}

fn todo() -> ToolEntry {
    ToolEntry::new(
        "todo",
        "todo",
        "Manage the task list of this session: write the whole list, or merge updates into it \
         by id. Returns the current list.",
        json!({
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "Items to write (or merge by id)",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]}
                        },
                        "required": ["id", "content", "status"]
                    }
                },
                "merge": {"type": "boolean", "default": false, "description": "Update items by id instead of replacing the list"}
            }
        }),
        refuse("todo"),
    )
    .with_emoji("📋")
}

fn memory() -> ToolEntry {
    ToolEntry::new(
        "memory",
        "memory",
        "Save durable facts across sessions: add an entry, replace or remove one (found by a \
         unique substring of its text), in the agent's notes or the user profile.",
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "replace", "remove"]},
                "target": {"type": "string", "enum": ["memory", "user"], "description": "The agent's notes or the user profile"},
                "content": {"type": "string", "description": "Text to add, or the replacement"},
                "old_text": {"type": "string", "description": "Unique substring of the entry to replace or remove"}
            },
            "required": ["action", "target"]
        }),
        refuse("memory"),
    )
    .with_emoji("🧠")
}

fn session_search() -> ToolEntry {
    ToolEntry::new(
        "session_search",
        "session_search",
        "Search past conversations of this user for a topic and return summaries of the \
         matching sessions.",
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "role_filter": {"type": "string", "description": "Only messages of these roles (comma-separated: user,assistant,tool)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 5, "default": 3}
            },
            "required": ["query"]
        }),
        refuse("session_search"),
    )
    .with_emoji("🔎")
}

fn delegate_task() -> ToolEntry {
    ToolEntry::new(
        "delegate_task",
        "delegation",
        "Hand a self-contained task (or several, run in parallel) to sub-agents with fresh \
         context and their own toolsets; returns their summaries.",
        json!({
            "type": "object",
            "properties": {
                "goal": {"type": "string", "description": "What the sub-agent must achieve"},
                "context": {"type": "string", "description": "Everything it needs to know; it sees nothing of this conversation"},
                "toolsets": {"type": "array", "items": {"type": "string"}, "description": "Toolsets it may use"},
                "tasks": {
                    "type": "array",
                    "description": "Several tasks to run in parallel instead of one goal",
                    "items": {
                        "type": "object",
                        "properties": {
                            "goal": {"type": "string"},
                            "context": {"type": "string"},
                            "toolsets": {"type": "array", "items": {"type": "string"}}
                        },
                        "required": ["goal"]
                    }
                },
                "max_iterations": {"type": "integer", "minimum": 1, "description": "Turn budget of each sub-agent"}
            }
        }),
        refuse("delegate_task"),
    )
    .with_emoji("🔀")
}

inventory::submit! { BuiltinTool(todo) }
inventory::submit! { BuiltinTool(memory) }
inventory::submit! { BuiltinTool(session_search) }
inventory::submit! { BuiltinTool(delegate_task) }
