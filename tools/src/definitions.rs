//! Building what the model sees: the tool definitions of a session, and the listing behind
//! `vibeos-exec tools list`.
//!
//! Selection follows SPEC §7: enabled toolsets → only those (an empty enabled list of a
//! [`ToolsetSelection`] → none); disabled toolsets → everything minus those; neither →
//! everything (when both are given, the disabled ones are subtracted from the enabled ones). Availability checks then drop tools that cannot run now. Finally the
//! `execute_code` definition is rewritten to name exactly the script tools that survived, with
//! the mode's working-directory note and the configured limits — so the model is never told
//! about a tool a script could not call.

use crate::availability::{availability_of, Availability};
use crate::entry::{ToolEntry, ToolSource};
use crate::registry::ToolRegistry;
use crate::toolsets::ToolsetError;
use crate::ToolsetSelection;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Name of the tool whose schema is rewritten after filtering.
pub const EXECUTE_CODE: &str = "execute_code";

/// What the `execute_code` description tells the model about where and how long scripts run.
/// Comes from the configuration; nothing here is assumed.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecuteCodeSettings {
    /// `project` or `strict` (anything else is described as `project`, as it runs).
    pub mode: String,
    /// The session working directory, when known (shown in project mode).
    pub cwd: Option<PathBuf>,
    /// Wall-clock limit of one script.
    pub timeout: Duration,
    /// Tool-call budget of one script.
    pub max_tool_calls: usize,
    /// Strict mode only: whether `terminal` is opened to scripts
    /// (`code_execution.strict.terminal`); otherwise it is not offered in strict mode.
    pub strict_terminal: bool,
    /// Strict mode only: whether plugin tools their plugins open to scripts are offered
    /// (`code_execution.strict.plugin_tools`); otherwise none is in strict mode.
    pub strict_plugin_tools: bool,
    /// Stdout cap of one script in bytes (`code_execution.stdout_limit`).
    pub stdout_limit: usize,
}

impl Default for ExecuteCodeSettings {
    /// The documented defaults of SPEC §5 (project mode, 300 s, 50 calls).
    fn default() -> Self {
        ExecuteCodeSettings {
            mode: "project".into(),
            cwd: None,
            timeout: Duration::from_secs(300),
            max_tool_calls: 50,
            strict_terminal: false,
            strict_plugin_tools: false,
            stdout_limit: 50 * 1024,
        }
    }
}

/// One row of `vibeos-exec tools list`.
#[derive(Debug, Clone)]
pub struct ToolStatus {
    /// Tool name.
    pub name: String,
    /// Its toolset.
    pub toolset: String,
    /// Emoji for listings.
    pub emoji: String,
    /// Variables it needs.
    pub requires_env: Vec<String>,
    /// Usable now, or why not.
    pub availability: Availability,
    /// Whether the handler is async.
    pub is_async: bool,
    /// Who registered it.
    pub source: ToolSource,
}

impl ToolRegistry {
    /// The registered tools selected by `enabled` / `disabled` toolset names, before availability
    /// checks, the lists as flags give them: an empty `enabled` list selects every toolset (the
    /// flag was not given; see [`ToolRegistry::select_toolsets`] for a selection that can say
    /// "none"). Unknown names are an error naming the valid ones; so are empty names (an empty
    /// name in a list selects nothing).
    pub fn select_tools(
        &self,
        enabled: &[String],
        disabled: &[String],
    ) -> Result<Vec<Arc<ToolEntry>>, ToolsetError> {
        self.select((!enabled.is_empty()).then_some(enabled), disabled)
    }

    /// The registered tools `selection` keeps, before availability checks: only its `enabled`
    /// toolsets when it has that list (none when the list is empty), every toolset otherwise;
    /// minus its `disabled` ones. Errors as [`ToolRegistry::select_tools`].
    pub fn select_toolsets(
        &self,
        selection: &ToolsetSelection,
    ) -> Result<Vec<Arc<ToolEntry>>, ToolsetError> {
        self.select(selection.enabled.as_deref(), &selection.disabled)
    }

    fn select(
        &self,
        enabled: Option<&[String]>,
        disabled: &[String],
    ) -> Result<Vec<Arc<ToolEntry>>, ToolsetError> {
        let tools = crate::registry::read_tools(self);
        let enabled: Option<Vec<&str>> = enabled
            .map(|names| toolset_names(names, "enabled"))
            .transpose()?;
        let disabled: Vec<&str> = toolset_names(disabled, "disabled")?;
        let names = self.with_resolver(&tools, |r| -> Result<BTreeSet<String>, ToolsetError> {
            let mut picked = BTreeSet::new();
            match &enabled {
                None => picked.extend(tools.keys().cloned()),
                Some(enabled) => {
                    for name in enabled {
                        r.resolve_into(name, &mut picked)?;
                    }
                }
            }
            let mut dropped = BTreeSet::new();
            for name in &disabled {
                r.resolve_into(name, &mut dropped)?;
            }
            Ok(&picked - &dropped)
        })?;
        Ok(names.iter().filter_map(|n| tools.get(n).cloned()).collect())
    }

    /// Every selected tool with its availability, for listings. Each distinct check runs once.
    pub fn tool_report(
        &self,
        enabled: &[String],
        disabled: &[String],
    ) -> Result<Vec<ToolStatus>, ToolsetError> {
        let entries = self.select_tools(enabled, disabled)?;
        let avail = availability_of(&entries, self.check_timeout());
        Ok(entries
            .iter()
            .zip(avail)
            .map(|(e, availability)| ToolStatus {
                name: e.name.clone(),
                toolset: e.toolset.clone(),
                emoji: e.emoji.clone(),
                requires_env: e.requires_env.clone(),
                availability,
                is_async: e.is_async,
                source: e.source.clone(),
            })
            .collect())
    }

    /// The OpenAI function-calling definitions the model gets, with the default
    /// [`ExecuteCodeSettings`]. See [`ToolRegistry::get_tool_definitions_with`].
    pub fn get_tool_definitions(
        &self,
        enabled: &[String],
        disabled: &[String],
    ) -> Result<Vec<Value>, ToolsetError> {
        self.get_tool_definitions_with(enabled, disabled, &ExecuteCodeSettings::default())
    }

    /// The OpenAI function-calling definitions the model gets: the tools selected by the
    /// toolsets (the lists as [`ToolRegistry::select_tools`] takes them), minus unavailable
    /// ones (each shared check run once), sorted by name, with the `execute_code` definition
    /// rewritten for the surviving script tools and `settings`.
    pub fn get_tool_definitions_with(
        &self,
        enabled: &[String],
        disabled: &[String],
        settings: &ExecuteCodeSettings,
    ) -> Result<Vec<Value>, ToolsetError> {
        self.prepare(crate::registry::Prepare::Definitions);
        let entries = self.select_tools(enabled, disabled)?;
        Ok(self.definitions_of(&entries, settings))
    }

    /// [`ToolRegistry::get_tool_definitions_with`] for a [`ToolsetSelection`], which can select
    /// no toolset at all (`enabled: Some(vec![])`: no definitions, fail closed).
    pub fn get_tool_definitions_for(
        &self,
        selection: &ToolsetSelection,
        settings: &ExecuteCodeSettings,
    ) -> Result<Vec<Value>, ToolsetError> {
        self.prepare(crate::registry::Prepare::Definitions);
        let entries = self.select_toolsets(selection)?;
        Ok(self.definitions_of(&entries, settings))
    }

    fn definitions_of(
        &self,
        entries: &[Arc<ToolEntry>],
        settings: &ExecuteCodeSettings,
    ) -> Vec<Value> {
        let avail = availability_of(entries, self.check_timeout());
        let survivors: Vec<&Arc<ToolEntry>> = entries
            .iter()
            .zip(&avail)
            .filter(|(_, a)| a.is_available())
            .map(|(e, _)| e)
            .collect();
        let script_tools: Vec<&ToolEntry> = self
            .script_tool_names()
            .iter()
            .filter_map(|n| survivors.iter().find(|e| e.name == *n))
            .filter(|e| self.is_script_callable(e))
            .map(|e| e.as_ref())
            .collect();
        survivors
            .iter()
            .map(|e| {
                let mut def = e.definition();
                if e.name == EXECUTE_CODE {
                    def["function"]["description"] = Value::String(execute_code_description(
                        &e.description,
                        &script_tools,
                        settings,
                    ));
                }
                def
            })
            .collect()
    }
}

/// The names, trimmed; an empty one is an error: `[""]` (`--enable-toolsets ''`) was taken for
/// no selection at all and selected every tool, `terminal` included.
fn toolset_names<'a>(
    names: &'a [String],
    list: &'static str,
) -> Result<Vec<&'a str>, ToolsetError> {
    names
        .iter()
        .map(|s| match s.trim() {
            "" => Err(ToolsetError::EmptyName { list }),
            name => Ok(name),
        })
        .collect()
}

/// The execute_code description for the script tools that survived filtering. Each is shown
/// with the signature its `vibeos_tools` function has; a tool the stub cannot define is left
/// out, as the stub leaves it out.
pub fn execute_code_description(
    base: &str,
    script_tools: &[&ToolEntry],
    settings: &ExecuteCodeSettings,
) -> String {
    let mut out = base.trim_end().to_string();
    out.push_str("\n\n");
    let strict = settings.mode == "strict";
    // (tool, its parameter list as the stub names the parameters: `class` → `class_`), so a
    // call written from this description works.
    let kept: Vec<(&ToolEntry, String)> = script_tools
        .iter()
        .copied()
        .filter(|e| !strict || settings.strict_terminal || e.name != "terminal")
        .filter(|e| {
            !strict
                || settings.strict_plugin_tools
                || !matches!(e.source, crate::entry::ToolSource::Plugin(_))
        })
        .filter_map(|e| {
            let params = e.script_function().ok()?;
            Some((e, vibeos_rpc::signature_text(&params)))
        })
        .collect();
    let script_tools = kept.as_slice();
    if script_tools.is_empty() {
        out.push_str(
            "No tools are available to scripts in this session: `vibeos_tools` exports none \
             (only its helpers json_parse, shell_quote and retry), so the script can only compute \
             and print. Call tools directly instead.",
        );
    } else {
        let names: Vec<&str> = script_tools.iter().map(|(e, _)| e.name.as_str()).collect();
        out.push_str(&format!(
            "Tools available to the script (`from vibeos_tools import {}`), nothing else:\n",
            names.join(", ")
        ));
        for (e, signature) in script_tools {
            // The doc line the stub's function starts its docstring with, by the same rule.
            match vibeos_rpc::doc_line(&e.description) {
                "" => out.push_str(&format!("- {}({})\n", e.name, signature)),
                doc => out.push_str(&format!("- {}({}): {doc}\n", e.name, signature)),
            }
        }
        out.push_str(
            "Each returns a dict; a failed call returns {\"error\": ...} instead of raising. \
             Helpers: json_parse(text), shell_quote(s), retry(fn, max_attempts=3, delay=2).",
        );
    }
    out.push_str("\n\n");
    if settings.mode == "strict" {
        out.push_str(
            "Mode strict: the script runs in an empty private staging directory (its working \
             directory), confined: no network and no files outside that directory. Use the tools \
             for files: they too act only inside the sandbox — reads beneath the staging \
             directory, the session working directory and configured read roots; writes beneath \
             the staging directory, the session working directory and configured write roots; symlinks, `..` and hard links \
             cannot lead out.",
        );
        // The tools resolve relative paths as a direct call would, in the session dir, while
        // the script's own `open()` resolves them in the staging dir: said, so a script that
        // writes a file and hands its name to a tool passes an absolute path.
        let named = settings
            .cwd
            .as_ref()
            .map_or(String::new(), |cwd| format!(" ({})", cwd.display()));
        out.push_str(&format!(
            " Relative paths given to the tools resolve in the session working directory{named}, \
             not in the script's own working directory: pass a file the script wrote as an \
             absolute path (os.path.abspath)."
        ));
        if settings.strict_terminal {
            out.push_str(
                " Except `terminal`: the operator opened it to strict scripts \
                 (code_execution.strict.terminal), and its commands run outside the sandbox, \
                 with the supervisor's user and rights, in the session working directory.",
            );
        } else {
            out.push_str(" No shell commands can be run from a strict script.");
        }
    } else {
        match &settings.cwd {
            Some(cwd) => out.push_str(&format!(
                "Mode project: the script runs in the session working directory ({}) with the \
                 project's Python (the active virtualenv or conda env when set); relative paths \
                 resolve there. The tools act with the supervisor's rights on any path.",
                cwd.display()
            )),
            None => out.push_str(
                "Mode project: the script runs in the session working directory with the \
                 project's Python (the active virtualenv or conda env when set); relative paths \
                 resolve there. The tools act with the supervisor's rights on any path.",
            ),
        }
    }
    out.push_str(&format!(
        "\nLimits: killed after {}s; at most {} tool calls per script; only what the script \
         prints is returned, and stdout is capped at {}: longer output keeps its first 40% and \
         last 60% with a marker saying how much was left out, so print summaries, not raw data.",
        seconds(settings.timeout),
        settings.max_tool_calls,
        byte_size(settings.stdout_limit)
    ));
    out
}

/// `50 KB`, `1.5 MB`, `900 bytes`: sizes as the description states them.
fn byte_size(bytes: usize) -> String {
    const KB: usize = 1024;
    const MB: usize = 1024 * 1024;
    let one_decimal = |n: usize, unit: usize, name: &str| {
        if n.is_multiple_of(unit) {
            format!("{} {name}", n / unit)
        } else {
            format!("{:.1} {name}", n as f64 / unit as f64)
        }
    };
    if bytes >= MB {
        one_decimal(bytes, MB, "MB")
    } else if bytes >= KB {
        one_decimal(bytes, KB, "KB")
    } else {
        format!("{bytes} bytes")
    }
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", d.as_secs())
    } else {
        format!("{s:.1}")
    }
}
