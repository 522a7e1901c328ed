//! The schema a tool has inside an execute_code script.
//!
//! Some parameters make sense only for the agent: `terminal`'s `background` and `pty` start
//! processes that outlive the call or need a terminal, and scripts run foreground commands only
//! (SPEC §2). Offering them in the stub and then ignoring them would be a silent lie, so the stub
//! and the execute_code description are generated from this reduced schema: a script passing
//! them gets Python's own "unexpected keyword argument" error, and the handler refuses them for
//! script calls in any case.
//!
//! Which tools a script can import at all, and under which parameter names, is decided by the
//! stub generator ([`vibeos_rpc::stub_function`]): a tool whose name is not a Python identifier
//! or is taken by a stub helper cannot be a function of `vibeos_tools`. The registry asks the
//! same function ([`ToolEntry::script_function`]) before listing, allowing or describing a script
//! tool, so a tool is offered to the model exactly when the stub defines it, with its names.

use crate::ToolEntry;
use serde_json::Value;
use vibeos_rpc::{StubError, StubParam};

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

    /// The function `vibeos_tools` defines for this tool: its parameters as the stub names them
    /// (`class` → `class_`), or why the stub leaves the tool out.
    pub fn script_function(&self) -> Result<Vec<StubParam>, StubError> {
        vibeos_rpc::stub_function(&self.name, &self.script_schema())
    }
}
