//! Environment scrubbing (SPEC §4): which variables reach an execute_code child.
//!
//! The rules are data (`policies/env.json`, compiled in); this module only applies them, in the
//! spec's order, and says for every variable which rule decided it — the same decision feeds the
//! child's environment and `vibeos-exec env audit`, so the audit can never disagree with what a
//! script sees.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};

const DEFAULT_POLICY: &str = include_str!("../../policies/env.json");

/// The reviewed lists the scrubber applies.
#[derive(Debug, Clone, Deserialize)]
pub struct EnvPolicy {
    /// Case-insensitive substrings that mark a name as secret.
    pub deny_substrings: Vec<String>,
    /// Exact names of safe system variables.
    pub safe_names: Vec<String>,
    /// Explicit prefixes of safe system variables (e.g. `LC_`).
    pub safe_prefixes: Vec<String>,
    /// The product's own prefix.
    pub vibeos_prefix: String,
    /// `VIBEOS_*` names that pass by exact name.
    pub vibeos_allowlist: Vec<String>,
    /// Provider credentials the product manages: never passed, not even by passthrough.
    pub provider_blocklist: Vec<String>,
    /// Names the supervisor sets itself after scrubbing.
    pub injected: Vec<String>,
}

/// Why a variable was kept or dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Kept: listed in `terminal.env_passthrough` or by a loaded skill.
    Passthrough,
    /// Dropped: a provider credential the product manages (never passes).
    ProviderBlocklist,
    /// Dropped: the name contains a secret-looking substring.
    SecretSubstring,
    /// Kept: a safe system variable.
    SafeSystem,
    /// Kept: an allowlisted `VIBEOS_*` name.
    VibeosAllowlist,
    /// Dropped: a `VIBEOS_*` name that is not allowlisted.
    VibeosNotAllowlisted,
    /// Dropped: matched no keep rule.
    NotAllowlisted,
    /// Dropped: the name is not valid Unicode, so no rule can vouch for it.
    NonUnicodeName,
}

impl Rule {
    /// Whether the variable reaches the child.
    pub fn keeps(self) -> bool {
        matches!(
            self,
            Rule::Passthrough | Rule::SafeSystem | Rule::VibeosAllowlist
        )
    }

    /// Short explanation for audits.
    pub fn describe(self) -> &'static str {
        match self {
            Rule::Passthrough => "passthrough (terminal.env_passthrough or a skill)",
            Rule::ProviderBlocklist => "provider credential managed by vibeos (never passed)",
            Rule::SecretSubstring => "name looks secret (KEY, TOKEN, SECRET, ...)",
            Rule::SafeSystem => "safe system variable",
            Rule::VibeosAllowlist => "allowlisted VIBEOS_* name",
            Rule::VibeosNotAllowlisted => "VIBEOS_* name not allowlisted",
            Rule::NotAllowlisted => "not on any allowlist",
            Rule::NonUnicodeName => "name is not valid Unicode",
        }
    }
}

/// The decision for one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The variable's name (lossy for non-Unicode names; values are never kept).
    pub name: String,
    /// The rule that decided it.
    pub rule: Rule,
}

/// The policy file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file is not a valid policy.
    #[error("environment policy {path} is invalid: {source}")]
    Invalid {
        /// Where the policy came from.
        path: String,
        /// What the parser said.
        source: serde_json::Error,
    },
}

impl EnvPolicy {
    /// The compiled-in policy from `policies/env.json`.
    pub fn builtin() -> Result<Self, PolicyError> {
        serde_json::from_str(DEFAULT_POLICY).map_err(|source| PolicyError::Invalid {
            path: "policies/env.json (built in)".into(),
            source,
        })
    }

    /// Decides one name. `passthrough` is the configured plus skill-declared list.
    pub fn decide(&self, name: &str, passthrough: &BTreeSet<String>) -> Rule {
        if self.provider_blocklist.iter().any(|b| b == name) {
            return Rule::ProviderBlocklist;
        }
        if passthrough.contains(name) {
            return Rule::Passthrough;
        }
        if self
            .deny_substrings
            .iter()
            .any(|s| contains_ignoring_ascii_case(name, s))
        {
            return Rule::SecretSubstring;
        }
        if self.safe_names.iter().any(|s| s == name)
            || self
                .safe_prefixes
                .iter()
                .any(|p| name.starts_with(p.as_str()) && name.len() > p.len())
        {
            return Rule::SafeSystem;
        }
        if name.starts_with(&self.vibeos_prefix) {
            if self.vibeos_allowlist.iter().any(|s| s == name) {
                return Rule::VibeosAllowlist;
            }
            return Rule::VibeosNotAllowlisted;
        }
        Rule::NotAllowlisted
    }

    /// Applies the policy to `vars`: returns the kept variables and the decision for every one.
    /// Logs, at DEBUG and once, the `VIBEOS_*` names that were dropped (names only).
    pub fn scrub<I>(&self, vars: I, passthrough: &BTreeSet<String>) -> Scrubbed
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let scrubbed = self.scrub_quiet(vars, passthrough);
        self.log_dropped(&scrubbed);
        scrubbed
    }

    /// [`EnvPolicy::scrub`] without the log line: for an environment prepared ahead of the
    /// execution that will use it (the interpreter pool), which logs when it is used.
    pub fn scrub_quiet<I>(&self, vars: I, passthrough: &BTreeSet<String>) -> Scrubbed
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut kept = Vec::new();
        let mut decisions = Vec::new();
        for (name, value) in vars {
            let rule = match name.to_str() {
                Some(n) => self.decide(n, passthrough),
                None => Rule::NonUnicodeName,
            };
            let display = name.to_string_lossy().into_owned();
            if rule.keeps() {
                kept.push((name, value));
            }
            decisions.push(Decision {
                name: display,
                rule,
            });
        }
        Scrubbed { kept, decisions }
    }

    /// Logs, at DEBUG, the `VIBEOS_*` names `scrubbed` dropped (names only).
    pub fn log_dropped(&self, scrubbed: &Scrubbed) {
        let dropped_vibeos: Vec<&str> = scrubbed
            .decisions
            .iter()
            .filter(|d| !d.rule.keeps() && d.name.starts_with(&self.vibeos_prefix))
            .map(|d| d.name.as_str())
            .collect();
        if !dropped_vibeos.is_empty() {
            tracing::debug!(
                "execute_code: dropped {} non-allowlisted VIBEOS_* var(s): {} — add them to terminal.env_passthrough to allow them",
                dropped_vibeos.len(),
                dropped_vibeos.join(", ")
            );
        }
    }

    /// Whether `name` is a provider credential that can never be passed through.
    pub fn is_provider_credential(&self, name: &OsStr) -> bool {
        name.to_str()
            .is_some_and(|n| self.provider_blocklist.iter().any(|b| b == n))
    }
}

/// Result of scrubbing an environment.
#[derive(Debug, Clone)]
pub struct Scrubbed {
    /// Variables that reach the child, in input order.
    pub kept: Vec<(OsString, OsString)>,
    /// The decision for every input variable.
    pub decisions: Vec<Decision>,
}

/// Whether `haystack` contains `needle`, ASCII letters compared without case. Every variable is
/// checked against every deny substring on each execution's path: no allocation per check.
fn contains_ignoring_ascii_case(haystack: &str, needle: &str) -> bool {
    let (hay, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrings_match_whatever_the_ascii_case() {
        assert!(contains_ignoring_ascii_case("github_token", "TOKEN"));
        assert!(contains_ignoring_ascii_case("MY_Api_Key_2", "api_key"));
        assert!(contains_ignoring_ascii_case("anything", ""));
        assert!(!contains_ignoring_ascii_case("TOKE", "TOKEN"));
        assert!(!contains_ignoring_ascii_case("PATH", "TOKEN"));
        // Only ASCII letters fold, as `to_ascii_uppercase` did.
        assert!(contains_ignoring_ascii_case("ÄPFEL_token", "ÄPFEL_TOKEN"));
        assert!(!contains_ignoring_ascii_case("äpfel_token", "ÄPFEL_TOKEN"));
    }

    fn policy() -> EnvPolicy {
        EnvPolicy::builtin().unwrap()
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn rules_apply_in_the_specified_order() {
        let p = policy();
        let pass: BTreeSet<String> = ["MY_API_KEY", "OPENAI_API_KEY", "VIBEOS_KANBAN_DB"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(p.decide("MY_API_KEY", &pass), Rule::Passthrough);
        assert_eq!(p.decide("OPENAI_API_KEY", &pass), Rule::ProviderBlocklist);
        assert_eq!(p.decide("VIBEOS_KANBAN_DB", &pass), Rule::Passthrough);
        assert_eq!(p.decide("github_token", &none()), Rule::SecretSubstring);
        assert_eq!(p.decide("SENTRY_DSN", &none()), Rule::SecretSubstring);
        assert_eq!(p.decide("PATH", &none()), Rule::SafeSystem);
        assert_eq!(p.decide("LC_ALL", &none()), Rule::SafeSystem);
        assert_eq!(p.decide("XDG_CONFIG_HOME", &none()), Rule::SafeSystem);
        assert_eq!(p.decide("PATHOLOGICAL_VAR", &none()), Rule::NotAllowlisted);
        assert_eq!(p.decide("LC_", &none()), Rule::NotAllowlisted);
        assert_eq!(p.decide("VIBEOS_HOME", &none()), Rule::VibeosAllowlist);
        assert_eq!(
            p.decide("VIBEOS_BASE_URL", &none()),
            Rule::VibeosNotAllowlisted
        );
        assert_eq!(
            p.decide("VIBEOS_AUTH_HEADER", &none()),
            Rule::SecretSubstring
        );
        assert_eq!(p.decide("RANDOM_THING", &none()), Rule::NotAllowlisted);
    }

    #[test]
    fn scrub_keeps_values_of_kept_names_only() {
        let vars = vec![
            (OsString::from("PATH"), OsString::from("/bin")),
            (
                OsString::from("AWS_SECRET_ACCESS_KEY"),
                OsString::from("s3cr3t"),
            ),
        ];
        let out = policy().scrub(vars, &none());
        assert_eq!(
            out.kept,
            vec![(OsString::from("PATH"), OsString::from("/bin"))]
        );
        assert_eq!(out.decisions.len(), 2);
        assert_eq!(out.decisions[1].rule, Rule::SecretSubstring);
    }
}
