//! The schema a tool has inside an execute_code script.
//!
//! Some parameters make sense only for the agent: `terminal`'s `background` and `pty` start
//! processes that outlive the call or need a terminal, and scripts run foreground commands only
//! (SPEC §2). Offering them in the stub and then ignoring them would be a silent lie, so the stub
//! and the execute_code description are generated from this reduced schema: a script passing
//! them gets Python's own "unexpected keyword argument" error, and the handler refuses them for
//! script calls in any case.

use crate::ToolEntry;
use serde_json::Value;

/// Parameters stripped from a tool's schema for scripts, by tool name.
pub const AGENT_ONLY_PARAMETERS: &[(&str, &[&str])] =
    &[("terminal", &["background", "pty", "notify_on_complete"])];

impl ToolEntry {
    /// The argument schema scripts see: [`ToolEntry::schema`] without the tool's
    /// [`AGENT_ONLY_PARAMETERS`].
    pub fn script_schema(&self) -> Value {
        let Some((_, drop)) = AGENT_ONLY_PARAMETERS.iter().find(|(n, _)| *n == self.name) else {
            return self.schema.clone();
        };
        let mut schema = self.schema.clone();
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            for p in *drop {
                props.remove(*p);
            }
        }
        if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
            req.retain(|r| !r.as_str().is_some_and(|r| drop.contains(&r)));
        }
        schema
    }
}
