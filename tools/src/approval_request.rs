//! What an approval is about and how it is answered, and the normal form of a command that
//! the pattern tiers match. Both halves of approval use these — [`crate::approval`] (the
//! decision order) and [`crate::approval_policy`] (hardline tier, deny rules, smart approver,
//! asking a host) — so they live below both and the two import them from here rather than
//! from each other. Public through `crate::approval`.

use crate::CallOrigin;
use regex::Regex;
use std::sync::LazyLock;

static IFS: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\$\{?ifs\}?(?:\$[0-9@*])?").ok());
static COMMAND_PATH: LazyLock<Option<Regex>> = LazyLock::new(|| {
    // Only cut paths in front of command names the patterns know, so `/etc/passwd` as an
    // argument stays a path.
    Regex::new(
        r"(^|[\s;&|(`])(?:[a-z0-9_.~-]*/)+(rm|dd|mkfs(?:\.[a-z0-9]+)?|mke2fs|wipefs|fdisk|sfdisk|parted|shred|chmod|chown|chgrp|kill|killall5?|pkill|systemctl|service|shutdown|reboot|halt|poweroff|init|sh|bash|zsh|dash|ksh|curl|wget|git|sudo|python[0-9.]*|perl|ruby|node|base64|xxd|openssl|find|tee|cp|mv|sed|truncate|eval|env)(\s|$)",
    )
    .ok()
});
static SPACES: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"[ \t\r\x0b\x0c]+").ok());

/// The form of a command that patterns are matched against: lower-case, line continuations
/// joined, quotes and backslashes removed, `$IFS` as a space, `/usr/bin/rm` as `rm`, newlines
/// as `;`, whitespace runs collapsed.
pub fn normalize_command(command: &str) -> String {
    let mut s = command.to_lowercase().replace("\\\n", " ");
    s = s.replace(['\'', '"', '\\'], "");
    if let Some(re) = IFS.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    s = s.replace('\n', " ; ");
    if let Some(re) = SPACES.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    if let Some(re) = COMMAND_PATH.as_ref() {
        // Twice, because a match consumes the separator the next command name needs.
        for _ in 0..2 {
            s = re.replace_all(&s, "$1$2$3").into_owned();
        }
    }
    s.trim().to_string()
}

/// What the user (or host) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalChoice {
    /// Run this command this time only.
    Once,
    /// Approve these patterns for the rest of the session.
    Session,
    /// Approve these patterns permanently (written to `command_allowlist`).
    Always,
    /// Do not run it.
    Deny,
}

/// What is being asked about.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// The command as given.
    pub command: String,
    /// Session/task id of the call, if any.
    pub task_id: Option<String>,
    /// Who asked to run it.
    pub origin: CallOrigin,
    /// `(key, description)` of every pattern that matched and is not yet approved.
    pub matches: Vec<(String, String)>,
    /// `command` is the source of a whole execute_code script (the whole-script guard), not a
    /// shell command.
    pub is_script: bool,
}

/// A host's approval prompt.
pub type ApprovalCallback = dyn Fn(&ApprovalRequest) -> ApprovalChoice + Send + Sync;
/// A smart-approval check: `true` auto-approves (once) a low-risk match.
pub type SmartApproval = dyn Fn(&ApprovalRequest) -> bool + Send + Sync;

/// A smart-approval rule that auto-approves recursive deletes of well-known, regenerable build
/// and dependency directories (`rm -rf node_modules/`, `target`, `__pycache__`, …) and nothing
/// else. Install it with `set_smart_approval(Some(Arc::new(low_risk_cleanup)))`.
pub fn low_risk_cleanup(req: &ApprovalRequest) -> bool {
    const REGENERABLE: [&str; 10] = [
        "node_modules",
        "target",
        "__pycache__",
        ".pytest_cache",
        "dist",
        "build",
        ".venv",
        ".mypy_cache",
        ".tox",
        ".next",
    ];
    if req.matches.iter().any(|(k, _)| k != "recursive_delete") {
        return false;
    }
    let norm = normalize_command(&req.command);
    if norm.contains([';', '&', '|', '`', '$', '>', '<', '*', '~']) {
        return false;
    }
    let mut words = norm.split(' ');
    if words.next() != Some("rm") {
        return false;
    }
    let targets: Vec<&str> = words.filter(|w| !w.starts_with('-')).collect();
    !targets.is_empty()
        && targets.iter().all(|t| {
            let t = t.trim_start_matches("./").trim_end_matches('/');
            REGENERABLE.contains(&t)
        })
}
