//! Environment scrubbing (SPEC §4): which variables reach an execute_code child.
//!
//! The rules are data (`policies/env.json`, compiled in); this module only applies them, in the
//! spec's order, and says for every variable which rule decided it — the same decision feeds the
//! child's environment and `vibeos-exec env audit`, so the audit can never disagree with what a
//! script sees.

use serde::Deserialize;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::sync::{Arc, Mutex, OnceLock};

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
    /// The compiled-in policy from `policies/env.json`, parsed once per process: every
    /// execution scrubs with it (twice for a forked one), and parsing the lists each time cost
    /// a warm call tens of microseconds.
    pub fn builtin() -> Result<&'static Self, PolicyError> {
        static PARSED: OnceLock<EnvPolicy> = OnceLock::new();
        if let Some(policy) = PARSED.get() {
            return Ok(policy);
        }
        let policy =
            serde_json::from_str(DEFAULT_POLICY).map_err(|source| PolicyError::Invalid {
                path: "policies/env.json (built in)".into(),
                source,
            })?;
        Ok(PARSED.get_or_init(|| policy))
    }

    /// Decides one name. `passthrough` is the configured plus skill-declared list.
    pub fn decide(&self, name: &str, passthrough: &BTreeSet<String>) -> Rule {
        // Any spelling of a managed credential's name: `openai_api_key` holds the same secret
        // as `OPENAI_API_KEY` (redaction and `terminal` compare the same way).
        if self
            .provider_blocklist
            .iter()
            .any(|b| b.eq_ignore_ascii_case(name))
        {
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
    /// Logs, at DEBUG and once, the `VIBEOS_*` names that were dropped (names only). Only for
    /// the environment of an execution's own child: SPEC §4 logs that line once per execution,
    /// so everything else (MCP servers, direct tool calls, the audit, probes) uses
    /// [`EnvPolicy::scrub_quiet`].
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
        let dropped_vibeos: Vec<Cow<'_, str>> = scrubbed
            .decisions
            .iter()
            // Only what a passthrough would let through: not a provider credential, and not
            // a name vibeos-exec sets itself (its own `VIBEOS_RPC_*` replace the caller's).
            .filter(|d| {
                !d.rule.keeps()
                    && d.rule != Rule::ProviderBlocklist
                    && d.name.starts_with(&self.vibeos_prefix)
                    && !SET_FOR_THE_CHILD.iter().any(|(name, ..)| *name == d.name)
            })
            .map(|d| printable_name(&d.name))
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
        name.to_str().is_some_and(|n| {
            self.provider_blocklist
                .iter()
                .any(|b| b.eq_ignore_ascii_case(n))
        })
    }
}

/// `name` (an environment variable's) as it can be shown on one line of a log or a table: any
/// name can be set, and a newline in one would start a line of its own (a forged log entry, a
/// broken audit table). Control characters and Unicode line separators are written as Rust
/// escapes (`\n`, `\u{1b}`), and a backslash is doubled so that no escape can be faked.
/// Whitespace at either end, and whitespace other than a plain space anywhere, is written as
/// an escape too (`\u{20}`): `VIBEOS_HOME ` (dropped) must not read as `VIBEOS_HOME` (kept) in
/// a table of names. A space inside a name reads as one.
pub fn printable_name(name: &str) -> Cow<'_, str> {
    let last = name.chars().count().saturating_sub(1);
    let needs_escape = |at: usize, c: char| {
        c.is_control()
            || matches!(c, '\\' | '\u{2028}' | '\u{2029}')
            || (c.is_whitespace() && (c != ' ' || at == 0 || at == last))
    };
    if !name.chars().enumerate().any(|(at, c)| needs_escape(at, c)) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for (at, c) in name.chars().enumerate() {
        if !needs_escape(at, c) {
            out.push(c);
        } else if c.is_whitespace() && !c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.extend(c.escape_debug());
        }
    }
    Cow::Owned(out)
}

/// Where the child's `TZ` comes from (SPEC §4 injects it in every mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TzSource {
    /// The caller's own `TZ`, passed on as it is (even empty, which the C library reads as UTC).
    Caller,
    /// The zone `/etc/localtime` links to (`…/zoneinfo/Europe/Berlin` gives `Europe/Berlin`).
    LocaltimeLink,
    /// `/etc/localtime` is a file, not a link: `:/etc/localtime`, which the C library reads as
    /// that file, so the child keeps the host's zone.
    LocaltimeFile,
    /// No `/etc/localtime`: `UTC`, what the C library assumes then anyway.
    Utc,
}

impl TzSource {
    /// Short explanation for audits.
    pub fn describe(self) -> &'static str {
        match self {
            TzSource::Caller => "the caller's TZ",
            TzSource::LocaltimeLink => "the zone /etc/localtime links to",
            TzSource::LocaltimeFile => "/etc/localtime, a file",
            TzSource::Utc => "no TZ and no /etc/localtime: UTC",
        }
    }
}

/// A script's variables as the tools take them: UTF-8 pairs, so a name or value that is not
/// UTF-8 reaches a tool lossily (the script itself gets the bytes unchanged).
pub fn lossy_pairs(vars: &[(OsString, OsString)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// The `TZ` an execute_code child gets, and where it came from: the caller's (`caller`, its
/// `TZ` if set), else the host's zone. Pinning it means a script sees the same zone whatever
/// interpreter, fork server or confinement runs it (a strict script cannot read `/etc` to find
/// out).
pub fn tz_with_source(caller: Option<OsString>) -> (OsString, TzSource) {
    match caller {
        Some(tz) => (tz, TzSource::Caller),
        None => {
            let (tz, source) = host_tz();
            (tz.clone(), *source)
        }
    }
}

/// The host's zone, computed once per process: one `readlink`, no file read, so the cold path
/// pays a single syscall.
fn host_tz() -> &'static (OsString, TzSource) {
    static HOST_TZ: std::sync::OnceLock<(OsString, TzSource)> = std::sync::OnceLock::new();
    HOST_TZ.get_or_init(|| tz_of_localtime(std::fs::read_link(LOCALTIME)))
}

/// The system's zone file.
const LOCALTIME: &str = "/etc/localtime";

/// The zone of `/etc/localtime` from what `readlink` said of it.
fn tz_of_localtime(link: std::io::Result<std::path::PathBuf>) -> (OsString, TzSource) {
    use std::os::unix::ffi::OsStrExt;
    match link {
        Ok(target) => {
            // The zone name is what follows the last `zoneinfo/` (`/usr/share/zoneinfo/`,
            // `../usr/share/zoneinfo/`, `/var/db/timezone/zoneinfo/`).
            let bytes = target.as_os_str().as_bytes();
            let marker = b"zoneinfo/";
            let name = bytes
                .windows(marker.len())
                .rposition(|w| w == marker)
                .map(|at| &bytes[at + marker.len()..])
                .filter(|name| !name.is_empty());
            match name {
                Some(name) => (
                    OsStr::from_bytes(name).to_os_string(),
                    TzSource::LocaltimeLink,
                ),
                // A link outside any zoneinfo tree: let the C library follow it.
                None => (format!(":{LOCALTIME}").into(), TzSource::LocaltimeFile),
            }
        }
        // Not a link (EINVAL): a copied zone file.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            (format!(":{LOCALTIME}").into(), TzSource::LocaltimeFile)
        }
        Err(_) => ("UTC".into(), TzSource::Utc),
    }
}

/// Which modes a variable set by vibeos-exec (or by the interpreter) is set in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetIn {
    /// Project and strict mode.
    Both,
    /// Project mode only.
    Project,
    /// Strict mode only.
    Strict,
    /// Set by Python itself, not by vibeos-exec, in either mode when a condition holds.
    ByPython,
}

/// A variable a script finds set that is not the caller's: its name, the modes, and what it
/// holds. `env audit` prints this table; `cli/tests/suite/env_and_interpreter.rs` checks it
/// against what scripts see in each mode, so it cannot drift from the launcher.
pub const SET_FOR_THE_CHILD: &[(&str, SetIn, &str)] = &[
    ("VIBEOS_RPC_TOKEN", SetIn::Both, "the RPC channel's token"),
    (
        "VIBEOS_RPC_DIR",
        SetIn::Project,
        "the RPC channel's directory",
    ),
    ("VIBEOS_RPC_SOCKET", SetIn::Project, "the RPC socket's path"),
    (
        "VIBEOS_RPC_FD",
        SetIn::Strict,
        "the inherited RPC socket's descriptor (no socket path to dial)",
    ),
    ("VIBEOS_RPC_STRICT", SetIn::Strict, "1"),
    ("TMPDIR", SetIn::Strict, "the staging dir"),
    (
        "TZ",
        SetIn::Both,
        "the caller's TZ, else the zone /etc/localtime links to, else UTC",
    ),
    (
        "HOME",
        SetIn::Both,
        "project: the caller's HOME (else the staging dir); strict: the staging dir",
    ),
    (
        "PATH",
        SetIn::Both,
        "the caller's PATH; when the default interpreter is a #! wrapper (a pyenv shim), the \
         directory of the Python it selects first, unless PATH has it already (as `pyenv exec` \
         does)",
    ),
    ("PYTHONDONTWRITEBYTECODE", SetIn::Both, "1"),
    ("PYTHONIOENCODING", SetIn::Both, "utf-8"),
    ("PYTHONUTF8", SetIn::Both, "1"),
    (
        "PYTHONPATH",
        SetIn::Both,
        "the staging dir first (project: then the session dir), then a kept PYTHONPATH",
    ),
    (
        "LC_CTYPE",
        SetIn::ByPython,
        "C.UTF-8, set by the interpreter (PEP 538 locale coercion) when LC_ALL, LC_CTYPE and \
         LANG leave the C locale",
    ),
];

/// The last environment scrubbed for a child with the built-in policy: the variables and
/// passthrough list it was made from, and the result.
type LastScrub = Option<(Vec<(OsString, OsString)>, BTreeSet<String>, Arc<Scrubbed>)>;
static LAST_SCRUB: Mutex<LastScrub> = Mutex::new(None);

/// `base` scrubbed with the built-in policy ([`EnvPolicy::scrub_quiet`]), reusing the last
/// result when `base` and `passthrough` are the same as then. A long-lived host scrubs the same
/// environment for every execution (twice for a forked one), and deciding each variable
/// against the deny lists cost a warm call about 50 µs; comparing the lists costs a few.
pub fn scrub_builtin(
    base: &[(OsString, OsString)],
    passthrough: &BTreeSet<String>,
) -> Result<Arc<Scrubbed>, PolicyError> {
    let policy = EnvPolicy::builtin()?;
    let mut last = LAST_SCRUB.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((vars, pass, scrubbed)) = last.as_ref() {
        if vars.as_slice() == base && pass == passthrough {
            return Ok(Arc::clone(scrubbed));
        }
    }
    let scrubbed = Arc::new(policy.scrub_quiet(base.iter().cloned(), passthrough));
    *last = Some((base.to_vec(), passthrough.clone(), Arc::clone(&scrubbed)));
    Ok(scrubbed)
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

/// Whether the interpreter reads `name` while starting (or while importing what the bootstrap
/// imports), so that changing it afterwards would not have the effect of a cold start. A
/// warm interpreter (pooled, or a fork server) is started with only these variables; it takes
/// the others with each call.
pub fn affects_startup(name: &str) -> bool {
    const PREFIXES: [&str; 4] = ["PYTHON", "LD_", "LC_", "MALLOC_"];
    const NAMES: [&str; 5] = ["LANG", "LANGUAGE", "HOME", "TZ", "GLIBC_TUNABLES"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
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

    #[test]
    fn a_remembered_scrub_is_used_only_for_the_same_environment_and_passthrough() {
        let pair = |k: &str, v: &str| (OsString::from(k), OsString::from(v));
        let names = |s: &Scrubbed| -> Vec<String> {
            s.kept
                .iter()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect()
        };
        let first = vec![pair("PATH", "/bin"), pair("LANG", "C")];
        let a = scrub_builtin(&first, &none()).unwrap();
        assert_eq!(names(&a), ["PATH", "LANG"]);
        // A changed value, an added secret, a removed variable: each is scrubbed anew.
        let changed = vec![pair("PATH", "/usr/bin"), pair("LANG", "C")];
        let b = scrub_builtin(&changed, &none()).unwrap();
        assert_eq!(b.kept[0].1, OsString::from("/usr/bin"));
        let with_secret = vec![pair("PATH", "/bin"), pair("MY_API_TOKEN", "s3cret")];
        assert_eq!(
            names(&scrub_builtin(&with_secret, &none()).unwrap()),
            ["PATH"]
        );
        assert_eq!(
            names(&scrub_builtin(&first[..1], &none()).unwrap()),
            ["PATH"]
        );
        // The same variables with the secret passed through by name.
        let pass: BTreeSet<String> = ["MY_API_TOKEN".to_string()].into();
        assert_eq!(
            names(&scrub_builtin(&with_secret, &pass).unwrap()),
            ["PATH", "MY_API_TOKEN"]
        );
    }

    fn policy() -> &'static EnvPolicy {
        EnvPolicy::builtin().unwrap()
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn rules_apply_in_the_specified_order() {
        let p = policy();
        let pass: BTreeSet<String> = [
            "MY_API_KEY",
            "OPENAI_API_KEY",
            "openai_api_key",
            "VIBEOS_KANBAN_DB",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(p.decide("MY_API_KEY", &pass), Rule::Passthrough);
        assert_eq!(p.decide("OPENAI_API_KEY", &pass), Rule::ProviderBlocklist);
        assert_eq!(p.decide("openai_api_key", &pass), Rule::ProviderBlocklist);
        assert_eq!(p.decide("VIBEOS_KANBAN_DB", &pass), Rule::Passthrough);
        assert_eq!(p.decide("build_token", &none()), Rule::SecretSubstring);
        assert_eq!(p.decide("github_token", &none()), Rule::ProviderBlocklist);
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
    fn tz_is_the_callers_else_the_host_zone() {
        use std::io::{Error, ErrorKind};
        use std::path::PathBuf;
        assert_eq!(
            tz_with_source(Some("Asia/Tokyo".into())),
            ("Asia/Tokyo".into(), TzSource::Caller)
        );
        // Without the caller's, never absent (the bug: no TZ at all under `env -i`).
        assert!(!tz_with_source(None).0.is_empty());
        for (target, want) in [
            ("/usr/share/zoneinfo/Europe/Berlin", "Europe/Berlin"),
            ("../usr/share/zoneinfo/Etc/UTC", "Etc/UTC"),
            (
                "/usr/share/zoneinfo/right/America/New_York",
                "right/America/New_York",
            ),
            ("/var/db/timezone/zoneinfo/Asia/Kolkata", "Asia/Kolkata"),
        ] {
            assert_eq!(
                tz_of_localtime(Ok(PathBuf::from(target))),
                (want.into(), TzSource::LocaltimeLink),
                "{target}"
            );
        }
        assert_eq!(
            tz_of_localtime(Ok(PathBuf::from("/opt/zones/custom"))),
            (":/etc/localtime".into(), TzSource::LocaltimeFile)
        );
        assert_eq!(
            tz_of_localtime(Err(Error::from(ErrorKind::InvalidInput))),
            (":/etc/localtime".into(), TzSource::LocaltimeFile)
        );
        assert_eq!(
            tz_of_localtime(Err(Error::from(ErrorKind::NotFound))),
            ("UTC".into(), TzSource::Utc)
        );
    }

    #[test]
    fn every_injected_name_of_the_policy_is_in_the_audit_table() {
        for name in &policy().injected {
            assert!(
                SET_FOR_THE_CHILD.iter().any(|(n, _, _)| n == name),
                "{name} is injected but env audit would not list it"
            );
        }
    }

    #[test]
    fn names_are_printed_on_one_line() {
        assert_eq!(printable_name("VIBEOS_X"), "VIBEOS_X");
        assert_eq!(
            printable_name("VIBEOS_A\nFORGED\r\u{1b}[31m\u{2028}"),
            "VIBEOS_A\\nFORGED\\r\\u{1b}[31m\\u{2028}"
        );
        // A literal backslash-n is told apart from a newline.
        assert_eq!(printable_name("A\\nB"), "A\\\\nB");
        assert_eq!(printable_name("VIBEOS_HOME "), "VIBEOS_HOME\\u{20}");
        assert_eq!(printable_name("A\u{a0}B\tC"), "A\\u{a0}B\\tC");
        assert_eq!(printable_name(" A B "), "\\u{20}A B\\u{20}");
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
