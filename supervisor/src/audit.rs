//! `vibeos-exec env audit`: which variables of the current environment a script would see, and
//! the rule that decided each. Names only; values never leave this process.

use crate::env_policy::{self, EnvPolicy, PolicyError, SetIn, SET_FOR_THE_CHILD};
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

/// A variable a script finds set that is not the caller's (`env_policy::SET_FOR_THE_CHILD`).
#[derive(Debug, Clone)]
pub struct SetForChild {
    /// Variable name.
    pub name: &'static str,
    /// The modes it is set in: `project`, `strict`, or both; empty when the interpreter sets
    /// it (see `by_python`).
    pub modes: Vec<&'static str>,
    /// Set by Python itself (under a condition `value` states), not by vibeos-exec.
    pub by_python: bool,
    /// What it holds (never a secret: the token is described, not shown).
    pub value: String,
}

/// Audits this process's environment under `passthrough`: the decision for every variable, and
/// the variables set for the child on top, by mode.
pub fn audit(passthrough: &[String]) -> Result<(Vec<AuditLine>, Vec<SetForChild>), PolicyError> {
    let policy = EnvPolicy::builtin()?;
    let pass: BTreeSet<String> = passthrough.iter().cloned().collect();
    // Quiet: the audit shows every decision itself; the dropped-names line is execute_code's.
    let scrubbed = policy.scrub_quiet(std::env::vars_os(), &pass);
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
    Ok((lines, set_for_child(std::env::var_os("TZ"))))
}

/// The table of [`env_policy::SET_FOR_THE_CHILD`], with the `TZ` a script would get now from
/// `caller_tz` (a zone name is no secret).
fn set_for_child(caller_tz: Option<std::ffi::OsString>) -> Vec<SetForChild> {
    SET_FOR_THE_CHILD
        .iter()
        .map(|&(name, set_in, value)| {
            let mut value = value.to_string();
            if name == "TZ" {
                let (tz, source) = env_policy::tz_with_source(caller_tz.clone());
                value = format!(
                    "{} (here: {}, {})",
                    value,
                    tz.to_string_lossy(),
                    source.describe()
                );
            }
            SetForChild {
                name,
                modes: match set_in {
                    SetIn::Both => vec!["project", "strict"],
                    SetIn::Project => vec!["project"],
                    SetIn::Strict => vec!["strict"],
                    SetIn::ByPython => Vec::new(),
                },
                by_python: set_in == SetIn::ByPython,
                value,
            }
        })
        .collect()
}

/// The audit as a table for people: one line per variable, whatever its name holds
/// ([`env_policy::printable_name`]).
pub fn render_table(lines: &[AuditLine], set: &[SetForChild]) -> String {
    let names: Vec<_> = lines
        .iter()
        .map(|l| env_policy::printable_name(&l.name))
        .collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!("{:<width$}  {:<7}  RULE\n", "NAME", "RESULT");
    for (l, name) in lines.iter().zip(&names) {
        out.push_str(&format!(
            "{:<width$}  {:<7}  {}\n",
            name,
            if l.kept { "kept" } else { "dropped" },
            l.rule
        ));
    }
    let kept = lines.iter().filter(|l| l.kept).count();
    out.push_str(&format!(
        "\n{kept} kept, {} dropped.\n\nAlso set for the script (by vibeos-exec, or by Python where said):\n",
        lines.len() - kept,
    ));
    let width = set.iter().map(|v| v.name.len()).max().unwrap_or(4).max(4);
    let modes = |v: &SetForChild| {
        if v.by_python {
            "by Python".to_string()
        } else if v.modes.len() == 2 {
            "both modes".to_string()
        } else {
            format!("{} only", v.modes.join(", "))
        }
    };
    for v in set {
        out.push_str(&format!(
            "{:<width$}  {:<12}  {}\n",
            v.name,
            modes(v),
            v.value
        ));
    }
    out.push_str(&format!(
        "\nThe terminal commands a script runs get the script's environment without its RPC\n\
         channel (the VIBEOS_RPC_* variables and, in strict mode, TMPDIR) and with {}: it\n\
         marks them and what they start, so the execution's end finds what they left running.\n",
        vibeos_tools::environments::local::SCOPE_VAR
    ));
    out
}

/// The audit as JSON: `variables` (every variable and its decision), `injected` (the names
/// vibeos-exec sets, in either mode) and `set_for_child` (each with its modes and value).
pub fn render_json(lines: &[AuditLine], set: &[SetForChild]) -> Value {
    json!({
        "variables": lines.iter().map(|l| json!({"name": l.name, "kept": l.kept, "rule": l.rule})).collect::<Vec<_>>(),
        "injected": set.iter().filter(|v| !v.by_python).map(|v| v.name).collect::<Vec<_>>(),
        "set_for_child": set.iter().map(|v| json!({
            "name": v.name,
            "modes": v.modes,
            "set_by": if v.by_python { "python" } else { "vibeos-exec" },
            "value": v.value,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_variables_are_listed_in_their_own_mode_only() {
        let set = set_for_child(Some("Asia/Tokyo".into()));
        let modes = |name: &str| {
            set.iter()
                .find(|v| v.name == name)
                .map(|v| v.modes.clone())
                .unwrap_or_else(|| panic!("{name} not listed"))
        };
        assert_eq!(modes("VIBEOS_RPC_DIR"), ["project"]);
        assert_eq!(modes("VIBEOS_RPC_SOCKET"), ["project"]);
        assert_eq!(modes("VIBEOS_RPC_FD"), ["strict"]);
        assert_eq!(modes("TZ"), ["project", "strict"]);
        let lc = set
            .iter()
            .find(|v| v.name == "LC_CTYPE")
            .map(|v| v.by_python);
        assert_eq!(lc, Some(true));
        let tz = set.iter().find(|v| v.name == "TZ").map(|v| v.value.clone());
        assert!(tz.is_some_and(|t| t.contains("here: Asia/Tokyo")));
        let table = render_table(&[], &set);
        assert!(table.contains("VIBEOS_RPC_FD"), "{table}");
        assert!(table.contains("strict only"), "{table}");
        assert!(table.contains("LC_CTYPE"), "{table}");
        let v = render_json(&[], &set);
        assert!(v["injected"]
            .as_array()
            .is_some_and(|a| !a.iter().any(|n| n == "LC_CTYPE")));
    }
}
