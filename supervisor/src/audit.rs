//! `vibeos-exec env audit`: which variables of the current environment a script would see, and
//! the rule that decided each. Names only; values never leave this process.

use crate::env_policy::{EnvPolicy, PolicyError};
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// One line of the audit.
#[derive(Debug, Clone)]
pub struct AuditLine {
    /// Variable name.
    pub name: String,
    /// Whether a script would see it.
    pub kept: bool,
    /// The deciding rule, explained.
    pub rule: &'static str,
}

/// Audits this process's environment under `passthrough`.
pub fn audit(passthrough: &[String]) -> Result<(Vec<AuditLine>, Vec<String>), PolicyError> {
    let policy = EnvPolicy::builtin()?;
    let pass: BTreeSet<String> = passthrough.iter().cloned().collect();
    let scrubbed = policy.scrub(std::env::vars_os(), &pass);
    let mut lines: Vec<AuditLine> = scrubbed
        .decisions
        .into_iter()
        .map(|d| AuditLine {
            name: d.name,
            kept: d.rule.keeps(),
            rule: d.rule.describe(),
        })
        .collect();
    lines.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((lines, policy.injected.clone()))
}

/// The audit as a table for people.
pub fn render_table(lines: &[AuditLine], injected: &[String]) -> String {
    let width = lines.iter().map(|l| l.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:<width$}  {:<7}  RULE\n", "NAME", "RESULT");
    for l in lines {
        out.push_str(&format!(
            "{:<width$}  {:<7}  {}\n",
            l.name,
            if l.kept { "kept" } else { "dropped" },
            l.rule
        ));
    }
    let kept = lines.iter().filter(|l| l.kept).count();
    out.push_str(&format!(
        "\n{kept} kept, {} dropped. Always set by vibeos-exec: {}\n",
        lines.len() - kept,
        injected.join(", ")
    ));
    out
}

/// The audit as JSON.
pub fn render_json(lines: &[AuditLine], injected: &[String]) -> Value {
    json!({
        "variables": lines.iter().map(|l| json!({"name": l.name, "kept": l.kept, "rule": l.rule})).collect::<Vec<_>>(),
        "injected": injected,
    })
}
