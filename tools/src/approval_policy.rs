//! The configurable half of dangerous-command approval (SPEC §8): `approvals.*` settings, the
//! hardline tier, user deny rules, the smart approver and asking a host within a timeout.
//!
//! [`crate::approval`] decides; this module holds what the decision consults, so the pattern
//! matching there stays independent of configuration and hosts.
//!
//! ```yaml
//! approvals:
//!   mode: manual        # manual (ask) | smart (a smart approver first) | off (approve all but hardline)
//!   timeout: 60         # seconds a host (callback, MCP client) has to answer; then deny
//!   deny:               # user deny rules: pattern keys or globs over the command; never run
//!     - "git push * main"  # (a top-level `command_denylist:` list is read too)
//!   smart_command: "my-approver --json"   # optional: reads the request (JSON) on stdin,
//!                                          # prints approve | deny | escalate
//! ```

use crate::approval_request::{
    command_views, glob_regex, low_risk_cleanup, ApprovalAnswer, ApprovalHost, ApprovalRequest,
    NoAnswer, COMMAND_START,
};
use crate::policy_file::{self, PolicyFileError};
use regex::Regex;
use serde::Deserialize;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

const HARDLINE_JSON: &str = include_str!("../../policies/hardline_patterns.json");

/// Default time a host has to answer an approval request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// `approvals.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalMode {
    /// Ask (host callback, MCP client, TTY); non-interactive runs deny.
    Manual,
    /// A smart approver decides first (approve / deny / escalate); escalations are asked.
    Smart,
    /// Approve every dangerous command except the hardline tier and user deny rules.
    Off,
}

impl ApprovalMode {
    /// The mode `approvals.mode` names (any case; YAML's `off`-as-`false` too), or what is
    /// wrong with it. One reading for the check at start (`vibeos_supervisor::config`, an
    /// error there) and the one at each command ([`settings`], a warning there).
    pub fn from_config(value: &crate::config_file::TextOrBool) -> Result<Self, String> {
        use crate::config_file::TextOrBool;
        match value {
            TextOrBool::Text(m) => match m.trim().to_ascii_lowercase().as_str() {
                "manual" => Ok(ApprovalMode::Manual),
                "smart" => Ok(ApprovalMode::Smart),
                "off" => Ok(ApprovalMode::Off),
                _ => Err(format!("must be manual, smart or off, found {m:?}")),
            },
            // YAML 1.1 spellings of `off` arrive as a boolean.
            TextOrBool::Bool(false) => Ok(ApprovalMode::Off),
            TextOrBool::Bool(true) => Err("must be manual, smart or off, found true".into()),
        }
    }

    /// The mode as config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Manual => "manual",
            ApprovalMode::Smart => "smart",
            ApprovalMode::Off => "off",
        }
    }
}

/// The `approvals:` section, read at each check (an "always" answer or an edit applies to the
/// next command).
#[derive(Debug, Clone)]
pub struct ApprovalSettings {
    /// `approvals.mode` (default manual).
    pub mode: ApprovalMode,
    /// `approvals.timeout` (default 60 s).
    pub timeout: Duration,
    /// `approvals.deny`: pattern keys or globs over the command.
    pub deny: Vec<String>,
    /// `approvals.smart_command`: a command consulted in smart mode.
    pub smart_command: Option<String>,
    /// Why config.yaml could not be read, when it has not parsed once in this process: its deny
    /// rules are then unknown, and every command is refused until it is fixed.
    pub unreadable: Option<String>,
}

impl Default for ApprovalSettings {
    fn default() -> Self {
        ApprovalSettings {
            mode: ApprovalMode::Manual,
            timeout: DEFAULT_TIMEOUT,
            deny: Vec::new(),
            smart_command: None,
            unreadable: None,
        }
    }
}

/// The current `approvals:` settings. A wrong value is logged and its default used, except an
/// unknown `mode`, which falls back to `manual` (the strictest) with a warning.
pub fn settings() -> ApprovalSettings {
    let mut s = ApprovalSettings::default();
    let file = match crate::settings::current_or_last_good() {
        Ok(file) => file,
        Err(e) => {
            tracing::error!("{e}; refusing commands until it is fixed");
            s.unreadable = Some(e.to_string());
            return s;
        }
    };
    let section = file.approvals.clone().unwrap_or_default();
    match section.mode.as_ref().map(ApprovalMode::from_config) {
        None => {}
        Some(Ok(mode)) => s.mode = mode,
        Some(Err(e)) => tracing::warn!("approvals.mode {e}; using manual"),
    }
    match section.timeout.map(approval_timeout) {
        None => {}
        Some(Ok(t)) => s.timeout = t,
        Some(Err(e)) => tracing::warn!("approvals.timeout {e}; using 60"),
    }
    if let Some(deny) = &section.deny {
        s.deny = deny.clone();
    }
    // `command_denylist` at the top level, beside `command_allowlist`, means the same.
    if let Some(deny) = &file.command_denylist {
        s.deny.extend(deny.iter().cloned());
    }
    if let Some(c) = section.smart_command.filter(|c| !c.trim().is_empty()) {
        s.smart_command = Some(c);
    }
    s
}

/// The time `approvals.timeout` gives a host to answer (seconds, positive, at most a day), or
/// what is wrong with it; read like [`ApprovalMode::from_config`].
pub fn approval_timeout(secs: f64) -> Result<Duration, String> {
    if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(format!(
            "must be a number of seconds (positive, at most 86400), found {secs}"
        ))
    }
}

/// One never-approvable pattern.
#[derive(Debug)]
pub struct HardlinePattern {
    /// Stable name.
    pub key: String,
    /// Shown in the refusal.
    pub description: String,
    /// Regex over the normalised command.
    pub regex: Regex,
    /// Applies only when the `device` group names a mounted device.
    pub mounted_device: bool,
    /// Applies only when the function the `name` group defines calls itself in the background
    /// or through a pipe in its `body` group (a fork bomb; the regex crate has no
    /// back-references to say so in the pattern).
    pub self_call: bool,
}

#[derive(Deserialize)]
struct HardlineFile {
    patterns: Vec<HardlineData>,
}

#[derive(Deserialize)]
struct HardlineData {
    key: String,
    description: String,
    regex: String,
    #[serde(default)]
    mounted_device: bool,
    #[serde(default)]
    self_call: bool,
}

/// Where the hardline patterns come from, as named in errors.
pub const HARDLINE_PATTERNS_FILE: &str = "policies/hardline_patterns.json";

/// Compiles a hardline policy. A pattern that does not compile, or a file that does not parse,
/// is an error naming it: the hardline tier is never silently shorter.
pub fn compile_hardline_patterns(
    json: &str,
    file: &str,
) -> Result<Vec<HardlinePattern>, PolicyFileError> {
    let data: HardlineFile = policy_file::parse(json, file)?;
    data.patterns
        .into_iter()
        .map(|p| {
            let regex = policy_file::compile(
                &mut regex::RegexBuilder::new(&p.regex),
                file,
                &p.key,
                "regex",
            )?;
            Ok(HardlinePattern {
                key: p.key,
                description: p.description,
                regex,
                mounted_device: p.mounted_device,
                self_call: p.self_call,
            })
        })
        .collect()
}

static HARDLINE: LazyLock<Result<Vec<HardlinePattern>, PolicyFileError>> =
    LazyLock::new(|| compile_hardline_patterns(HARDLINE_JSON, HARDLINE_PATTERNS_FILE));

/// The hardline tier, compiled once from `policies/hardline_patterns.json`; the error when that
/// policy is broken (then every command is refused).
pub fn hardline_patterns() -> Result<&'static [HardlinePattern], &'static PolicyFileError> {
    HARDLINE.as_deref()
}

/// The mount and swap tables (`/proc/mounts`, `/proc/swaps`) the mounted-device rules read.
pub fn mount_table() -> String {
    format!(
        "{}\n{}",
        std::fs::read_to_string("/proc/mounts").unwrap_or_default(),
        std::fs::read_to_string("/proc/swaps").unwrap_or_default()
    )
}

/// The hardline pattern `command` matches, if any (mounted devices read from /proc now); the
/// policy's error when it is broken.
pub fn detect_hardline(
    command: &str,
) -> Result<Option<&'static HardlinePattern>, &'static PolicyFileError> {
    Ok(detect_hardline_in(
        hardline_patterns()?,
        command,
        &mount_table(),
    ))
}

/// [`detect_hardline`] against a given mount table (first field of each line: the source).
pub fn detect_hardline_with(
    command: &str,
    mounts: &str,
) -> Result<Option<&'static HardlinePattern>, &'static PolicyFileError> {
    Ok(detect_hardline_in(hardline_patterns()?, command, mounts))
}

/// The first of `patterns` that `command` matches (in any of its [`command_views`]), given the
/// mount table.
pub fn detect_hardline_in<'p>(
    patterns: &'p [HardlinePattern],
    command: &str,
    mounts: &str,
) -> Option<&'p HardlinePattern> {
    hardline_in_views(patterns, &command_views(command), mounts)
}

/// [`detect_hardline_in`] on views already computed (one decision computes them once).
pub(crate) fn hardline_in_views<'p>(
    patterns: &'p [HardlinePattern],
    views: &[String],
    mounts: &str,
) -> Option<&'p HardlinePattern> {
    patterns
        .iter()
        .find(|p| views.iter().any(|v| hardline_hits(p, v, mounts)))
}

fn hardline_hits(p: &HardlinePattern, view: &str, mounts: &str) -> bool {
    if p.mounted_device {
        // The group may hold several words (`tee A B`): each `/dev/…` one is a target.
        return p.regex.captures_iter(view).any(|c| {
            c.name("device").is_some_and(|d| {
                d.as_str()
                    .split_whitespace()
                    .filter(|w| w.starts_with("/dev/"))
                    .any(|w| is_mounted(w, mounts))
            })
        });
    }
    if p.self_call {
        // `${FUNCNAME}`'s braces would end the body the regex takes.
        let view = view.replace("${funcname}", "$funcname");
        return p
            .regex
            .captures_iter(&view)
            .any(|c| match (c.name("name"), c.name("body")) {
                (Some(n), Some(b)) => calls_itself_async(n.as_str(), b.as_str()),
                _ => false,
            });
    }
    p.regex.is_match(view)
}

/// Whether `body` runs the command `name` in the background (`name &`) or in a pipeline
/// (`name |`, `| name`): what makes a self-calling function a fork bomb.
fn calls_itself_async(name: &str, body: &str) -> bool {
    // Inside a function bash's `$FUNCNAME` is its own name (the views are lower case).
    let body = &body.replace("$funcname", name);
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || "_:.-".contains(c);
    let mut from = 0;
    while let Some(i) = body[from..].find(name).map(|i| i + from) {
        let end = i + name.len();
        from = i + 1;
        let before = body[..i].trim_end();
        let starts_command = body[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !is_name_char(c))
            && (before.is_empty() || before.ends_with([';', '&', '|', '{', '(']));
        if !starts_command || body[end..].starts_with(is_name_char) {
            continue;
        }
        let after = body[end..].trim_start();
        let piped_in = before.ends_with('|') && !before.ends_with("||");
        let forked = (after.starts_with('&') && !after.starts_with("&&"))
            || (after.starts_with('|') && !after.starts_with("||"));
        if forked || piped_in {
            return true;
        }
    }
    false
}

/// Whether `dev` is a mounted source, or a whole disk one of whose partitions is. `dev` may
/// be a glob (`/dev/vd[a]`, `/dev/sd*`): then any mounted source or its disk it matches counts.
fn is_mounted(dev: &str, mounts: &str) -> bool {
    let sources = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|src| src.starts_with("/dev/"));
    if dev.contains(['*', '?', '[']) {
        let Ok(glob) = globset::Glob::new(dev).map(|g| g.compile_matcher()) else {
            // Not a glob the shell could expand to anything we can name: treat as mounted
            // rather than guess it harmless (only reached for mkfs/dd-style writes).
            return true;
        };
        return sources
            .into_iter()
            .any(|src| glob.is_match(src) || glob.is_match(disk_of(src)));
    }
    let real = std::fs::canonicalize(dev)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| dev.to_string());
    sources.into_iter().any(|src| {
        [dev, real.as_str()].iter().any(|d| {
            src == *d
                || src.strip_prefix(*d).is_some_and(|rest| {
                    rest.trim_start_matches('p')
                        .starts_with(|c: char| c.is_ascii_digit())
                })
        })
    })
}

/// The whole disk of a partition (`/dev/vda1` → `/dev/vda`, `/dev/nvme0n1p2` →
/// `/dev/nvme0n1`); other names unchanged.
fn disk_of(src: &str) -> &str {
    let trimmed = src.trim_end_matches(|c: char| c.is_ascii_digit());
    if trimmed.len() == src.len() {
        return src;
    }
    match trimmed.strip_suffix('p') {
        Some(d) if d.ends_with(|c: char| c.is_ascii_digit()) => d,
        _ if trimmed.ends_with(|c: char| c.is_ascii_digit()) => src,
        _ => trimmed,
    }
}

/// The first user deny rule that matches: a pattern key among `matched_keys`, or a glob that
/// matches the start of any one command of the line — after `;`, `&&`, `||`, `|`, `&`, `(`, a
/// backtick or `$(`, with wrappers such as `sudo`, `env` or `bash -c` removed — up to a word
/// boundary, so `git push * main` also refuses `cd repo && git push origin main` and
/// `git push origin main --force`. `*` does not cross a command separator.
pub fn denied_by_rule(rules: &[String], command: &str, matched_keys: &[&str]) -> Option<String> {
    denied_by_rule_in_views(rules, &command_views(command), matched_keys)
}

/// [`denied_by_rule`] on the command's views already computed.
pub(crate) fn denied_by_rule_in_views(
    rules: &[String],
    views: &[String],
    matched_keys: &[&str],
) -> Option<String> {
    rules
        .iter()
        .find(|rule| {
            if matched_keys.contains(&rule.as_str()) {
                return true;
            }
            let re = match Regex::new(&format!(
                "{COMMAND_START}(?:{})(?:$|\\s|[;&|)}}`])",
                glob_regex(rule, true)
            )) {
                Ok(re) => re,
                Err(e) => {
                    // A glob with a broken class (`[z-a]`): still refuse what it spells out
                    // literally rather than drop the user's rule.
                    tracing::warn!("approvals.deny rule `{rule}` is not a valid glob ({e})");
                    match Regex::new(&format!(
                        "{COMMAND_START}{}(?:$|\\s|[;&|)}}`])",
                        regex::escape(&crate::approval_request::normalize_command(rule))
                    )) {
                        Ok(re) => re,
                        Err(_) => return false,
                    }
                }
            };
            views.iter().any(|v| re.is_match(v))
        })
        .cloned()
}

/// What a smart approver says about a dangerous command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmartVerdict {
    /// Run it (once).
    Approve,
    /// Do not run it.
    Deny,
    /// Not sure: ask as in manual mode.
    Escalate,
}

impl SmartVerdict {
    /// Parses `approve` / `deny` / `escalate` (any case, surrounding blanks ignored); anything
    /// else escalates. Only the three words count, whichever host installed the approver: a
    /// model answering "yes, but…" or "allowed" must not run a command nobody asked about.
    pub fn parse(answer: &str) -> SmartVerdict {
        match answer.trim().to_ascii_lowercase().as_str() {
            "approve" => SmartVerdict::Approve,
            "deny" => SmartVerdict::Deny,
            _ => SmartVerdict::Escalate,
        }
    }
}

/// A smart approver (an auxiliary model, a rule engine) installed by the host.
pub type SmartApprover = dyn Fn(&ApprovalRequest) -> SmartVerdict + Send + Sync;

static SMART_APPROVER: RwLock<Option<Arc<SmartApprover>>> = RwLock::new(None);

/// Installs (or with `None` removes) the smart approver consulted in `approvals.mode: smart`.
pub fn set_smart_approver(approver: Option<Arc<SmartApprover>>) {
    if let Ok(mut g) = SMART_APPROVER.write() {
        *g = approver;
    }
}

/// The smart verdict on `req`: the installed approver, else `approvals.smart_command`, else
/// the built-in low-risk rule (approve regenerable-directory cleanups, escalate the rest). A
/// failing or slow approver escalates: it can only save a question, never approve by failing.
pub fn smart_verdict(req: &ApprovalRequest, s: &ApprovalSettings) -> SmartVerdict {
    let approver = SMART_APPROVER.read().ok().and_then(|g| g.clone());
    if let Some(approver) = approver {
        let req = req.clone();
        return within(s.timeout, move || approver(&req)).unwrap_or_else(|e| {
            tracing::warn!("smart approver gave no verdict ({e}); escalating");
            SmartVerdict::Escalate
        });
    }
    if let Some(cmd) = &s.smart_command {
        return match run_smart_command(cmd, req, s.timeout) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("approvals.smart_command failed ({e}); escalating");
                SmartVerdict::Escalate
            }
        };
    }
    if low_risk_cleanup(req) {
        SmartVerdict::Approve
    } else {
        SmartVerdict::Escalate
    }
}

/// Runs `approvals.smart_command` (through `sh -c`) with the request as JSON on stdin; its
/// first stdout line is the verdict.
fn run_smart_command(
    cmd: &str,
    req: &ApprovalRequest,
    timeout: Duration,
) -> Result<SmartVerdict, String> {
    let mut child = Command::new("/bin/sh")
        .args(["-c", cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let body = serde_json::json!({
        "command": req.command,
        "task_id": req.task_id,
        "patterns": req.matches.iter().map(|(k, d)| serde_json::json!({"key": k, "description": d})).collect::<Vec<_>>(),
    });
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(body.to_string().as_bytes());
    }
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no verdict within {timeout:?}"));
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    Ok(SmartVerdict::parse(out.lines().next().unwrap_or("")))
}

/// Asks `host` about `req`, waiting at most `timeout`; no answer in time is
/// [`NoAnswer::TimedOut`] (the host's call keeps running on its own thread and its late answer
/// is dropped), a panic [`NoAnswer::CallbackFailed`].
pub fn ask_host(
    host: Arc<ApprovalHost>,
    req: &ApprovalRequest,
    timeout: Duration,
) -> ApprovalAnswer {
    let req = req.clone();
    match within(timeout, move || host(&req)) {
        Ok(answer) => answer,
        Err(Unfinished::TimedOut) => Err(NoAnswer::TimedOut(timeout)),
        Err(e) => Err(NoAnswer::CallbackFailed(e.to_string())),
    }
}

/// Why [`within`] has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unfinished {
    /// The function panicked.
    #[error("it panicked")]
    Panicked,
    /// Its thread could not be started.
    #[error("cannot start the approval thread: {0}")]
    NotStarted(String),
    /// It did not finish in time.
    #[error("no answer in time")]
    TimedOut,
}

/// Runs `f` on its own thread and waits at most `timeout` for it.
pub(crate) fn within<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unfinished> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("vibeos-approval".into())
        .spawn(move || {
            // A panic drops the sender unsent: the receiver then sees a disconnect, not a
            // timeout.
            if let Ok(v) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                let _ = tx.send(v);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the approval thread: {e}");
        return Err(Unfinished::NotStarted(e.to_string()));
    }
    rx.recv_timeout(timeout).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Timeout => Unfinished::TimedOut,
        std::sync::mpsc::RecvTimeoutError::Disconnected => Unfinished::Panicked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hardline_pattern_compiles() {
        let file: HardlineFile =
            serde_json::from_str(HARDLINE_JSON).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(hardline_patterns().unwrap().len(), file.patterns.len());
    }

    #[test]
    fn a_broken_hardline_policy_is_an_error_naming_file_and_pattern() {
        let e = compile_hardline_patterns(
            r#"{"patterns": [{"key": "ok", "description": "d", "regex": "a"},
                             {"key": "bad_one", "description": "d", "regex": "(unclosed"}]}"#,
            "x/hardline.json",
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("x/hardline.json: pattern `bad_one` (regex) does not compile"),
            "{text}"
        );
        let e = compile_hardline_patterns("{\"patterns\": [", "x/hardline.json").unwrap_err();
        assert!(matches!(e, PolicyFileError::Parse { .. }), "{e}");
        assert!(
            e.to_string().starts_with("x/hardline.json is not a valid"),
            "{e}"
        );
        let e =
            compile_hardline_patterns(r#"{"patterns": [{"key": "k"}]}"#, "x/h.json").unwrap_err();
        assert!(e.to_string().contains("missing field"), "{e}");
    }

    #[test]
    fn hardline_catches_the_catastrophic_and_not_the_merely_dangerous() {
        let mounts =
            "/dev/vda1 / ext4 rw 0 0\n/dev/nvme0n1p2 /home ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n";
        let key = |c: &str| {
            detect_hardline_with(c, mounts)
                .unwrap()
                .map(|p| p.key.as_str())
        };
        assert_eq!(key("rm -rf /"), Some("delete_root"));
        assert_eq!(key("sudo /bin/rm -r -f /*"), Some("delete_root"));
        assert_eq!(key("rm -rf --no-preserve-root /"), Some("delete_root"));
        assert_eq!(key("rm -rf /usr"), Some("delete_root"));
        // `..` leads back up: these are `/*`, `/usr`, `/etc` and `cd / && rm -rf *`.
        for c in [
            "rm -rf /tmp/../*",
            "rm -rf /var/../usr",
            "rm -rf /srv/../etc",
            "rm -rf /a/b/../../",
        ] {
            assert_eq!(key(c), Some("delete_root"), "{c}");
        }
        assert!(key("cd /tmp/.. && rm -rf *").is_some());
        // Whatever ends the path: a redirect, a subshell, a substitution, a trailing slash,
        // doubled slashes.
        for c in [
            "echo 'rm -rf /*>/dev/null'",
            "(rm -rf /*)",
            "x=$(rm -rf /*)",
            "x=`rm -rf /`",
            "rm -rf /*/",
            "rm -rf //*",
            "rm -rf //",
            "rm -rf /usr/*/",
            "rm -rf /etc<in",
        ] {
            assert_eq!(key(c), Some("delete_root"), "{c}");
        }
        assert_eq!(key("(kill -9 -1)"), Some("kill_every_process"));
        assert_eq!(key("chmod -R 777 /*"), Some("chmod_root"));
        assert_eq!(key("(chown -R nobody //)"), Some("chmod_root"));
        assert_eq!(key("mkfs.ext4 /dev/vda1"), Some("format_mounted_device"));
        assert_eq!(key("mkfs.ext4 /dev/vda"), Some("format_mounted_device"));
        assert_eq!(key("wipefs -a /dev/nvme0n1"), Some("format_mounted_device"));
        assert_eq!(
            key("dd if=/dev/zero of=/dev/vda bs=1M"),
            Some("overwrite_mounted_device")
        );
        assert_eq!(key(":(){ :|:& };:"), Some("fork_bomb"));
        assert_eq!(key("kill -9 -1"), Some("kill_every_process"));
        assert_eq!(key("chmod -R 777 /"), Some("chmod_root"));
        // Dangerous but approvable.
        for c in [
            "rm -rf build/",
            "rm -rf ./node_modules /tmp/x",
            "mkfs.ext4 /dev/sdb1",
            "dd if=/dev/zero of=/dev/sdc",
            "dd if=/dev/zero of=disk.img",
            "kill -9 1234",
            "chmod -R 755 ./site",
            "ls /",
            "rm -rf /tmp/build",
            "rm -rf /usr/local/lib/x",
            "(rm -rf /var/tmp/cache)>/dev/null",
            "rm -rf //srv/data",
        ] {
            assert_eq!(key(c), None, "{c}");
        }
    }

    #[test]
    fn deny_rules_match_keys_and_globs() {
        let rules = vec![
            "git_force_push".to_string(),
            "terraform destroy*".to_string(),
        ];
        assert!(denied_by_rule(&rules, "git push -f", &["git_force_push"]).is_some());
        assert!(denied_by_rule(&rules, "terraform destroy -auto-approve", &[]).is_some());
        assert!(denied_by_rule(&rules, "terraform plan", &[]).is_none());
    }

    #[test]
    fn a_deny_glob_catches_its_command_inside_a_compound_line() {
        // The probe report's finding 5: the README's own example rule.
        let rules = vec!["git push * main".to_string()];
        for cmd in [
            "git push origin main",
            "git push origin main; true",
            "true && git push origin main",
            "cd repo && git push origin main",
            "git push origin main --force",
            "(git push origin main)",
            "echo $(git push origin main)",
            "sudo -u dev git push origin main",
            "env GIT_TRACE=1 git push origin main",
            "bash -c 'git push origin main'",
            "GIT_PUSH origin main || git push origin main",
            // A command after assignments, or run by a keyword, is a command too.
            "FOO=1 git push origin main",
            "GIT_TRACE=0 A=b git push origin main",
            "if true; then git push origin main; fi",
            "for i in 1; do git push origin main; done",
            "true || { false; } && ! git push origin main",
            "if git push origin main; then :; fi",
        ] {
            assert!(denied_by_rule(&rules, cmd, &[]).is_some(), "{cmd}");
        }
        for cmd in [
            "git push origin dev",
            "git push origin mainline",
            "git push origin dev; echo main",
            "git pull origin main",
        ] {
            assert!(denied_by_rule(&rules, cmd, &[]).is_none(), "{cmd}");
        }
        // A refspec naming the branch needs a glob that says so.
        let refspec = vec!["git push * *main".to_string()];
        assert!(denied_by_rule(&refspec, "git push origin HEAD:main", &[]).is_some());
    }

    #[test]
    fn verdicts_parse_and_unclear_ones_escalate() {
        assert_eq!(SmartVerdict::parse("approve\n"), SmartVerdict::Approve);
        assert_eq!(SmartVerdict::parse("DENY"), SmartVerdict::Deny);
        assert_eq!(SmartVerdict::parse("maybe"), SmartVerdict::Escalate);
        // Words near a verdict are not one: the Python adapter escalates them too.
        for near in [
            "yes",
            "y",
            "allow",
            "approved",
            "no",
            "denied",
            "block",
            "approve it",
        ] {
            assert_eq!(SmartVerdict::parse(near), SmartVerdict::Escalate, "{near}");
        }
    }
}
