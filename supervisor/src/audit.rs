//! `vibeos-exec env audit`: which variables of the current environment a script would see, and
//! the rule that decided each. Names only; values never leave this process.
//!
//! A remote backend's script gets the same scrub minus what describes this host (PATH, HOME,
//! XDG_*…: the backend has its own), so the audit takes the backend the configuration selects.

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

/// What `env audit` found: every variable's decision, what is set on top, and where.
#[derive(Debug, Clone)]
pub struct Audit {
    /// One line per variable of this process's environment.
    pub lines: Vec<AuditLine>,
    /// The variables set for the script on top.
    pub set_for_child: Vec<SetForChild>,
    /// The remote backend the script would run in (`None`: this machine).
    pub backend: Option<&'static str>,
}

/// Why a kept variable does not reach a remote backend's script.
const HOST_SPECIFIC: &str = "host-specific: describes this machine, not sent to the backend \
                             (its own value applies there, if it has one)";

/// Audits this process's environment under `passthrough` for a script run by `backend` (`None`
/// or `Some("local")`: this machine): the decision for every variable, and the variables set
/// for the child on top, by mode.
pub fn audit_for(
    passthrough: &[String],
    backend: Option<&'static str>,
) -> Result<Audit, PolicyError> {
    let backend = backend.filter(|b| *b != "local");
    let (mut lines, local_set) = audit(passthrough)?;
    let set_for_child = match backend {
        None => local_set,
        Some(_) => {
            for line in lines.iter_mut().filter(|l| l.kept) {
                if !crate::remote::sent_over_there(&line.name) {
                    line.kept = false;
                    line.rule = HOST_SPECIFIC;
                }
            }
            set_over_there(std::env::var_os("TZ"))
        }
    };
    Ok(Audit {
        lines,
        set_for_child,
        backend,
    })
}

/// Audits this process's environment under `passthrough`: the decision for every variable, and
/// the variables set for the child on top, by mode.
pub fn audit(passthrough: &[String]) -> Result<(Vec<AuditLine>, Vec<SetForChild>), PolicyError> {
    Ok((
        audit_vars(std::env::vars_os(), passthrough)?,
        set_for_child(std::env::var_os("TZ")),
    ))
}

/// Names whose caller's value never reaches a script, in either mode: vibeos-exec sets its own
/// (each is in [`SET_FOR_THE_CHILD`] for both modes, with a value that is not the caller's).
/// A passthrough of one keeps the name and loses the value, which the audit must not call kept.
const REPLACED_FOR_THE_CHILD: [&str; 4] = [
    "VIBEOS_RPC_TOKEN",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
];

const REPLACED: &str = "replaced: vibeos-exec sets its own value for the script (below)";

const PASSTHROUGH_CHANGES_BEHAVIOUR: &str = "passthrough (terminal.env_passthrough or a skill) \
     -- WARNING: it changes how the dynamic loader, Python or the shell runs the script and every \
     terminal command it starts";

/// Whether a variable changes how a process runs rather than describing anything: the dynamic
/// loader's `LD_*` (`LD_PRELOAD`, `LD_AUDIT`), Python's `PYTHON*` besides `PYTHONPATH`
/// (`PYTHONHOME`, `PYTHONINSPECT`, `PYTHONSTARTUP`, `PYTHONWARNINGS`), and what shells run or
/// trace (`BASH_ENV`, `ENV`, `SHELLOPTS`, `PROMPT_COMMAND`, `PS4`, `IFS`). The scrub drops
/// them (not on any allowlist); an operator can pass one through, and the audit says what
/// that does.
fn changes_behaviour(name: &str) -> bool {
    (name.starts_with("LD_"))
        || (name.starts_with("PYTHON") && name != "PYTHONPATH")
        || name.starts_with("BASH_FUNC_")
        || matches!(
            name,
            "BASH_ENV"
                | "ENV"
                | "SHELLOPTS"
                | "BASHOPTS"
                | "PROMPT_COMMAND"
                | "PS4"
                | "IFS"
                | "GCONV_PATH"
                | "MALLOC_CONF"
                | "GLIBC_TUNABLES"
        )
}

/// The decision for every variable of `vars` under `passthrough`, sorted by name.
fn audit_vars(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    passthrough: &[String],
) -> Result<Vec<AuditLine>, PolicyError> {
    let policy = EnvPolicy::builtin()?;
    let pass: BTreeSet<String> = passthrough.iter().cloned().collect();
    // Quiet: the audit shows every decision itself; the dropped-names line is execute_code's.
    let scrubbed = policy.scrub_quiet(vars, &pass);
    let mut lines: Vec<AuditLine> = scrubbed
        .decisions
        .into_iter()
        .map(|d| {
            let (kept, rule) = if d.rule.keeps() && REPLACED_FOR_THE_CHILD.contains(&&*d.name) {
                (false, REPLACED)
            } else if d.rule == env_policy::Rule::Passthrough && changes_behaviour(&d.name) {
                (true, PASSTHROUGH_CHANGES_BEHAVIOUR)
            } else {
                (d.rule.keeps(), d.rule.describe())
            };
            AuditLine {
                name: d.name,
                kept,
                rule,
            }
        })
        .collect();
    lines.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(lines)
}

/// The table of [`env_policy::SET_FOR_THE_CHILD`], with the `TZ` a script would get now from
/// `caller_tz` (a zone name is no secret).
fn set_for_child(caller_tz: Option<std::ffi::OsString>) -> Vec<SetForChild> {
    SET_FOR_THE_CHILD
        .iter()
        .map(|&(name, set_in, value)| {
            let value = set_value(name, value, &caller_tz);
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

/// A set variable's value as the audit shows it: `TZ` also says which zone a script would get
/// now from `caller_tz`, and where that zone comes from.
fn set_value(name: &str, value: &str, caller_tz: &Option<std::ffi::OsString>) -> String {
    if name != "TZ" {
        return value.to_string();
    }
    let (tz, source) = env_policy::tz_with_source(caller_tz.clone());
    format!(
        "{value} (here: {}, {})",
        tz.to_string_lossy(),
        source.describe()
    )
}

/// What a remote backend's script finds set ([`crate::remote::SET_OVER_THERE`]; remote
/// backends run project mode only), with the `TZ` it would get now from `caller_tz`.
fn set_over_there(caller_tz: Option<std::ffi::OsString>) -> Vec<SetForChild> {
    let mut set: Vec<SetForChild> = crate::remote::SET_OVER_THERE
        .iter()
        .map(|&(name, value)| SetForChild {
            name,
            modes: vec!["project"],
            by_python: false,
            value: set_value(name, value, &caller_tz),
        })
        .collect();
    set.extend(set_for_child(caller_tz).into_iter().filter(|v| v.by_python));
    set
}

impl Audit {
    /// The audit as a table for people (see [`render_table`]).
    pub fn render_table(&self) -> String {
        match self.backend {
            None => render_table(&self.lines, &self.set_for_child),
            Some(backend) => format!(
                "backend: {backend} (the script runs there, in project mode; below, what this \
                 host's environment sends it)\n\n{}",
                table(
                    &self.lines,
                    &self.set_for_child,
                    &format!(
                        "\nThe terminal commands a script runs there get the script's variables \
                         without its RPC channel (the VIBEOS_RPC_* variables). PATH, HOME and \
                         LANG that this host does not send are the {backend} login's own.\n"
                    )
                )
            ),
        }
    }

    /// The audit as JSON (see [`render_json`]), with `backend` (`"local"` for this machine).
    pub fn to_json(&self) -> Value {
        let mut v = render_json(&self.lines, &self.set_for_child);
        if let Some(obj) = v.as_object_mut() {
            obj.insert("backend".into(), self.backend.unwrap_or("local").into());
        }
        v
    }
}

/// The audit as a table for people: one line per variable, whatever its name holds
/// ([`env_policy::printable_name`]).
pub fn render_table(lines: &[AuditLine], set: &[SetForChild]) -> String {
    table(
        lines,
        set,
        &format!(
            "\nThe terminal commands a script runs get the script's environment without its RPC\n\
             channel (the VIBEOS_RPC_* variables and, in strict mode, TMPDIR) and with {}: it\n\
             marks them and what they start, so the execution's end finds what they left running.\n",
            vibeos_tools::environments::local::SCOPE_VAR
        ),
    )
}

/// The variables, what is set on top, and `footer`.
fn table(lines: &[AuditLine], set: &[SetForChild], footer: &str) -> String {
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
    out.push_str(footer);
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
    fn passed_through_names_the_child_gets_anew_or_that_change_behaviour_are_said_so() {
        let vars = [
            "PYTHONIOENCODING",
            "VIBEOS_RPC_TOKEN",
            "LD_PRELOAD",
            "PYTHONINSPECT",
            "BASH_ENV",
            "PYTHONPATH",
            "MY_SETTING",
        ]
        .map(|n| (n.into(), "x".into()));
        let pass: Vec<String> = vars
            .iter()
            .map(|(n, _): &(std::ffi::OsString, std::ffi::OsString)| {
                n.to_string_lossy().into_owned()
            })
            .collect();
        let lines = audit_vars(vars.clone(), &pass).unwrap();
        let line = |name: &str| {
            lines
                .iter()
                .find(|l| l.name == name)
                .map(|l| (l.kept, l.rule))
                .unwrap_or_else(|| panic!("{name} not listed"))
        };
        for name in ["PYTHONIOENCODING", "VIBEOS_RPC_TOKEN"] {
            assert_eq!(line(name), (false, REPLACED), "{name}");
        }
        for name in ["LD_PRELOAD", "PYTHONINSPECT", "BASH_ENV"] {
            assert_eq!(line(name), (true, PASSTHROUGH_CHANGES_BEHAVIOUR), "{name}");
        }
        for name in ["PYTHONPATH", "MY_SETTING"] {
            assert_eq!(
                line(name),
                (true, env_policy::Rule::Passthrough.describe()),
                "{name}"
            );
        }
        // Without the passthrough they are dropped as before, with no warning.
        let lines = audit_vars(vars, &[]).unwrap();
        assert!(lines
            .iter()
            .filter(|l| l.name != "PYTHONPATH")
            .all(|l| !l.kept && l.rule != PASSTHROUGH_CHANGES_BEHAVIOUR && l.rule != REPLACED));
        // Every replaced name is one vibeos-exec sets in both modes.
        for name in REPLACED_FOR_THE_CHILD {
            assert!(
                SET_FOR_THE_CHILD
                    .iter()
                    .any(|(n, set_in, _)| *n == name && *set_in == SetIn::Both),
                "{name}"
            );
        }
    }

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
