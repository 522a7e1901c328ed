//! Dangerous-command approval for `terminal` (SPEC §8).
//!
//! Every command the terminal tool is asked to run is first checked here. The patterns are data
//! (`policies/dangerous_patterns.json`, compiled in) and are matched against a *normalised* form
//! of the command, so the obvious obfuscations — quotes inside words (`'r'm`), backslashes
//! (`r\m`), `$IFS` instead of spaces, `/bin/rm` instead of `rm`, odd spacing or case — do not
//! slip past a pattern written for the plain form.
//!
//! Decision order (settings and the hardline tier: [`crate::approval_policy`]):
//! 0. the hardline tier (`policies/hardline_patterns.json`): refused, whatever else says; then
//!    user deny rules (`approvals.deny`): refused; then a command matching no dangerous pattern
//!    runs, and with `approvals.mode: off` every other command runs too;
//! 1. the permanent allowlist (`command_allowlist` in config.yaml: pattern keys, or globs that
//!    approve the patterns matching inside one whole command of the line they match);
//! 2. approvals given earlier in the same session (per session/task id and pattern key; without
//!    a task id, see [`untracked_call`]);
//! 3. the optional smart-approval callback (may auto-approve low-risk matches); in
//!    `approvals.mode: smart` the smart approver (approve / deny / escalate);
//! 4. asking: the host callback when one is installed ([`set_approval_callback`]), which has
//!    `approvals.timeout` (default 60 s) to answer before it counts as a denial; else, on an
//!    interactive terminal, a TTY prompt (once / session / always / deny) — for direct agent
//!    calls and a script's commands alike; else (CI, scripts without a host or terminal) a
//!    denial with a message saying why. A host that has no answer ([`NoAnswer`]: its callback
//!    failed, the client erred or cancelled, time ran out, the terminal gave no input) is a
//!    denial whose message names that reason, never "denied by the user".
//!
//! "always" adds the pattern keys to `command_allowlist` in config.yaml; see [`persist_always`]
//! for how the rest of the file is kept.

use crate::approval_policy::{self, ApprovalMode, SmartVerdict};
// Defined below both this module and approval_policy, which consult them; public here.
pub use crate::approval_request::{
    command_views, low_risk_cleanup, normalize_command, shown_to_a_person, ApprovalAnswer,
    ApprovalCallback, ApprovalChoice, ApprovalHost, ApprovalRequest, NoAnswer, SmartApproval,
};
use crate::approval_request::{glob_regex, COMMAND_END, COMMAND_START};
use crate::policy_file::{self, PolicyFileError};
use crate::{CallOrigin, ToolContext};
use regex::Regex;
use regex::RegexBuilder;
use serde::Deserialize;
use std::collections::HashSet;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

/// The pattern data, reviewed and versioned with the code.
const PATTERNS_JSON: &str = include_str!("../../policies/dangerous_patterns.json");

/// One dangerous-command pattern.
#[derive(Debug)]
pub struct DangerousPattern {
    /// Stable name used by session approvals and `command_allowlist`.
    pub key: String,
    /// Human-readable description shown when asking.
    pub description: String,
    /// Regex over the normalised command.
    pub regex: Regex,
    /// A match of this regex cancels the pattern (e.g. `DELETE FROM … WHERE`).
    pub unless: Option<Regex>,
}

#[derive(Deserialize)]
struct PatternFile {
    patterns: Vec<PatternData>,
}

#[derive(Deserialize)]
struct PatternData {
    key: String,
    description: String,
    regex: String,
    #[serde(default)]
    unless: Option<String>,
}

/// The pattern of commands that change vibeos-exec's own config or plugins.
const OWN_CONFIG_KEY: &str = "vibeos_config_write";

/// Where the dangerous patterns come from, as named in errors.
pub const DANGEROUS_PATTERNS_FILE: &str = "policies/dangerous_patterns.json";

/// Compiles a dangerous-pattern policy. Any pattern that does not compile, or a file that does
/// not parse, is an error naming it: the list is never silently shorter.
pub fn compile_dangerous_patterns(
    json: &str,
    file: &str,
) -> Result<Vec<DangerousPattern>, PolicyFileError> {
    let data: PatternFile = policy_file::parse(json, file)?;
    data.patterns
        .into_iter()
        .map(|p| {
            let regex =
                policy_file::compile(&mut RegexBuilder::new(&p.regex), file, &p.key, "regex")?;
            let unless = p
                .unless
                .map(|u| policy_file::compile(&mut RegexBuilder::new(&u), file, &p.key, "unless"))
                .transpose()?;
            Ok(DangerousPattern {
                key: p.key,
                description: p.description,
                regex,
                unless,
            })
        })
        .collect()
}

static DANGEROUS: LazyLock<Result<Vec<DangerousPattern>, PolicyFileError>> =
    LazyLock::new(|| compile_dangerous_patterns(PATTERNS_JSON, DANGEROUS_PATTERNS_FILE));

/// Every dangerous pattern, compiled once from `policies/dangerous_patterns.json`; the error
/// when that policy is broken (then every command is refused).
pub fn dangerous_patterns() -> Result<&'static [DangerousPattern], &'static PolicyFileError> {
    DANGEROUS.as_deref()
}

/// The patterns `command` matches (empty when it is not dangerous); the policy's error when it
/// is broken.
pub fn detect_dangerous(
    command: &str,
) -> Result<Vec<&'static DangerousPattern>, &'static PolicyFileError> {
    Ok(matching(dangerous_patterns()?, command))
}

fn matching<'p>(patterns: &'p [DangerousPattern], command: &str) -> Vec<&'p DangerousPattern> {
    matching_views(patterns, &command_views(command))
}

/// The patterns that match one of a command's views.
fn matching_views<'p>(
    patterns: &'p [DangerousPattern],
    views: &[String],
) -> Vec<&'p DangerousPattern> {
    patterns
        .iter()
        .filter(|p| views.iter().any(|v| p.hits(v)))
        .collect()
}

impl DangerousPattern {
    /// Whether the pattern matches one view of a command (its `unless` not matching there).
    fn hits(&self, view: &str) -> bool {
        self.regex.is_match(view) && !self.unless.as_ref().is_some_and(|u| u.is_match(view))
    }
}

static HOST_CALLBACK: RwLock<Option<Arc<ApprovalHost>>> = RwLock::new(None);
static SMART_APPROVAL: RwLock<Option<Arc<SmartApproval>>> = RwLock::new(None);
static SESSION_APPROVALS: LazyLock<Mutex<HashSet<(String, String)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

/// Installs (or with `None` removes) the host's approval callback. When installed it is asked
/// for every unapproved dangerous command, scripts' included.
pub fn set_approval_callback(callback: Option<Arc<ApprovalCallback>>) {
    set_approval_host(
        callback.map(|cb| Arc::new(move |req: &ApprovalRequest| Ok(cb(req))) as Arc<ApprovalHost>),
    );
}

/// Installs (or with `None` removes) a host approval callback that can say why it has no
/// answer ([`NoAnswer`]): the refusal then names that reason instead of "denied by the user".
pub fn set_approval_host(host: Option<Arc<ApprovalHost>>) {
    if let Ok(mut g) = HOST_CALLBACK.write() {
        *g = host;
    }
}

/// Installs (or removes) the smart-approval callback, consulted before asking.
pub fn set_smart_approval(callback: Option<Arc<SmartApproval>>) {
    if let Ok(mut g) = SMART_APPROVAL.write() {
        *g = callback;
    }
}

/// Forgets the session approvals of `task_id` (`None`: the default session).
pub fn clear_session(task_id: Option<&str>) {
    let sid = session_key(task_id);
    if let Ok(mut g) = SESSION_APPROVALS.lock() {
        g.retain(|(s, _)| *s != sid);
    }
}

fn session_key(task_id: Option<&str>) -> String {
    task_id.unwrap_or("default").to_string()
}

static UNTRACKED_CALLS: Mutex<usize> = Mutex::new(0);

/// Marks a call without a task id (an execution or a direct tool call of a library host) as
/// running; see [`untracked_call`].
#[derive(Debug)]
#[must_use = "the call counts as running only while the guard lives"]
pub struct UntrackedCall(());

/// Starts a call that has no task id, in a host that serves many (the Python package): the
/// "session" approvals given without a task id last while such calls run and are forgotten
/// when the last one ends, so one "session" answer does not approve that pattern for every
/// later execution of the process. Hosts whose process *is* the session (the CLI) do not call
/// this, and their default session lasts the process. Calls without a task id that overlap
/// cannot be told apart and share it; pass task ids to keep callers' approvals apart.
pub fn untracked_call() -> UntrackedCall {
    let mut n = UNTRACKED_CALLS.lock().unwrap_or_else(|p| p.into_inner());
    *n += 1;
    UntrackedCall(())
}

impl Drop for UntrackedCall {
    fn drop(&mut self) {
        let mut n = UNTRACKED_CALLS.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            clear_session(None);
        }
    }
}

/// The outcome of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run it. `approved_by` says why (`not dangerous`, `allowlist`, `session`, `smart`, `user`).
    Allow {
        /// Which step let it through.
        approved_by: &'static str,
    },
    /// Do not run it; the message says why and what to do.
    Deny {
        /// Shown to the caller.
        message: String,
    },
}

/// Decides whether `command` may run in the call described by `ctx` (SPEC §8).
pub fn check_command(command: &str, ctx: &ToolContext) -> Decision {
    decide(command, None, ctx, false)
}

/// [`check_command`] for a command that starts in `dir` (its `workdir`, or where the terminal
/// session stands after an earlier `cd`): `rm -rf *` started in `/` is `cd / && rm -rf *`, and
/// `rm -rf etc` there is `rm -rf /etc`, so the hardline tier also judges each step of the
/// command where it runs (see [`steps_where_they_run`]).
pub fn check_command_in(command: &str, dir: &std::path::Path, ctx: &ToolContext) -> Decision {
    decide(command, Some(dir), ctx, false)
}

/// Each step of `command` as run where it runs, for the hardline tier: written after
/// `cd <dir>` (the tier knows `cd / && rm -rf *`) and with its relative words made absolute
/// (`rm -rf etc` in `/` is `rm -rf /etc`, `rm -rf ../etc` in `/tmp` too). A step's dir is
/// `start` (when known) until a `cd` or `pushd` to a literal path moves it; a `cd` the text
/// cannot follow (a variable, `-`, `~`, no argument, `popd`) ends the views, since the rest
/// runs somewhere unknown. Splitting at `;`, `&&`, `||`, `|`, `&` and newlines is a best
/// effort, like the views: a step cut too early only adds a view, and a `cd` inside a subshell
/// moves the rest further than the shell would, which also only adds views.
fn steps_where_they_run(command: &str, start: Option<&std::path::Path>) -> Vec<String> {
    let mut here = start.map(lexically_normal);
    let mut out = Vec::new();
    for step in command.split([';', '&', '|', '\n']) {
        let step = step.trim().trim_start_matches(['(', '{', '!', ' ', '\t']);
        let mut words = step.split_whitespace();
        let first = words.next().unwrap_or("");
        let first = first.rsplit('/').next().unwrap_or(first);
        if matches!(first, "cd" | "pushd" | "popd") {
            let target = words.find(|w| !w.starts_with('-')).map(unquoted);
            here = match (first, target, &here) {
                ("popd", _, _) => None,
                (_, Some(t), _) if t.contains(['$', '`', '~', '*', '?', '[']) => None,
                (_, Some(t), _) if t.starts_with('/') => Some(lexically_normal(t.as_ref())),
                (_, Some(t), Some(h)) => Some(lexically_normal(&h.join(t))),
                _ => None,
            };
            if here.is_none() {
                break;
            }
            continue;
        }
        let (Some(dir), false) = (&here, step.is_empty()) else {
            continue;
        };
        let shown = dir.to_string_lossy();
        out.push(format!("cd {shown} && {step}"));
        let mut absolute = vec![first.to_string()];
        for word in step.split_whitespace().skip(1) {
            let bare = unquoted(word);
            let relative = !bare.is_empty()
                && !bare.starts_with(['-', '/', '$', '`', '~', '>', '<'])
                && !bare.contains('=');
            absolute.push(if relative {
                lexically_normal(&dir.join(bare))
                    .to_string_lossy()
                    .into_owned()
            } else {
                word.to_string()
            });
        }
        out.push(absolute.join(" "));
    }
    out
}

/// `word` without the quotes a shell would remove around a plain path.
fn unquoted(word: &str) -> String {
    word.chars().filter(|c| !matches!(c, '"' | '\'')).collect()
}

/// `path` with `.` and `..` resolved by text, as the shell's `cd` does (`/usr/..` is `/`),
/// anchored at the root (`..` there stays there).
fn lexically_normal(path: &std::path::Path) -> std::path::PathBuf {
    crate::planner::lexical(&std::path::Path::new("/").join(path))
}

/// Says whether the installed host callback can reach someone for a task (an MCP server whose
/// client may or may not support elicitation): `Err` gives the reason it cannot. Without one,
/// an installed callback always can.
pub type HostReachability = dyn Fn(Option<&str>) -> Result<(), String> + Send + Sync;

static HOST_REACHABILITY: RwLock<Option<Arc<HostReachability>>> = RwLock::new(None);

/// Installs (or removes) the check of whether the host callback can ask anyone for a task.
pub fn set_host_reachability(check: Option<Arc<HostReachability>>) {
    if let Ok(mut g) = HOST_REACHABILITY.write() {
        *g = check;
    }
}

/// Whether a person or host can be asked now about `task_id`: a host callback is installed
/// (and reaches someone for that task), or this process has an interactive terminal. Scripts
/// are checked as a whole before they run only then ([`check_script`]); headless runs keep
/// the per-command checks.
pub fn approvals_interactive(task_id: Option<&str>) -> bool {
    let host = HOST_CALLBACK.read().ok().is_some_and(|g| g.is_some());
    (host && host_reachable(task_id).is_ok()) || interactive()
}

fn host_reachable(task_id: Option<&str>) -> Result<(), String> {
    match HOST_REACHABILITY.read().ok().and_then(|g| g.clone()) {
        Some(check) => check(task_id),
        None => Ok(()),
    }
}

/// The whole-script guard: when approvals are interactive, an execute_code script whose source
/// matches a dangerous pattern is asked about before it runs (the same chain as a command:
/// hardline, deny rules, mode, allowlist, session, smart, ask). Headless: always allowed here
/// (each `terminal` command is still checked when it runs). Static matching only sees what is
/// written literally; see docs/strict-mode.md for its limits.
pub fn check_script(source: &str, task_id: Option<&str>) -> Decision {
    if !approvals_interactive(task_id) {
        return Decision::Allow {
            approved_by: "not interactive",
        };
    }
    let mut ctx = ToolContext::agent("/");
    ctx.task_id = task_id.map(str::to_string);
    decide(source, None, &ctx, true)
}

fn decide(
    command: &str,
    dir: Option<&std::path::Path>,
    ctx: &ToolContext,
    is_script: bool,
) -> Decision {
    let policies =
        approval_policy::hardline_patterns().and_then(|h| Ok((h, dangerous_patterns()?)));
    decide_with(command, dir, ctx, is_script, policies)
}

/// [`decide`] against given pattern lists; a broken policy refuses everything (fail closed).
fn decide_with(
    command: &str,
    dir: Option<&std::path::Path>,
    ctx: &ToolContext,
    is_script: bool,
    policies: Result<(&[approval_policy::HardlinePattern], &[DangerousPattern]), &PolicyFileError>,
) -> Decision {
    let what = if is_script { "Script" } else { "Command" };
    let (hardline, dangerous) = match policies {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            return Decision::Deny {
                message: format!(
                    "{what} refused: the approval policy cannot be checked: {e}. Nothing runs \
                     through the approval check until the operator fixes it."
                ),
            };
        }
    };
    let mounts = approval_policy::mount_table();
    // Every check below reads the same views; they are computed once.
    let views = command_views(command);
    let in_dir = steps_where_they_run(command, dir);
    if let Some(h) = approval_policy::hardline_in_views(hardline, &views, &mounts).or_else(|| {
        in_dir
            .iter()
            .find_map(|c| approval_policy::detect_hardline_in(hardline, c, &mounts))
    }) {
        return Decision::Deny {
            message: format!(
                "{what} refused: it matches the hardline rule \"{}\" [{}], which no approval, \
                 allowlist or mode can allow. Do not retry it in any form.",
                h.description, h.key
            ),
        };
    }
    let settings = approval_policy::settings();
    if let Some(e) = &settings.unreadable {
        return Decision::Deny {
            message: format!(
                "{what} refused: the approval rules cannot be read ({e}), so a deny rule of the \
                 user's could be among them. Nothing runs through the approval check until the \
                 file is fixed."
            ),
        };
    }
    let mut matched = matching_views(dangerous, &views);
    // The config-write pattern reads text; a path to the home or config spelled another way
    // (relative, through a link) is found through the filesystem, from where it starts.
    if !matched.iter().any(|p| p.key == OWN_CONFIG_KEY) {
        let start = dir
            .map(std::path::Path::to_path_buf)
            .or_else(|| std::env::current_dir().ok());
        if let Some(start) = start {
            if crate::approval_request::writes_own_files(command, &views, &start) {
                matched.extend(dangerous.iter().filter(|p| p.key == OWN_CONFIG_KEY));
            }
        }
    }
    let keys: Vec<&str> = matched.iter().map(|p| p.key.as_str()).collect();
    if let Some(rule) = approval_policy::denied_by_rule_in_views(&settings.deny, &views, &keys) {
        return Decision::Deny {
            message: format!(
                "{what} refused by the user's deny rule `{rule}` (approvals.deny in {}). Do not \
                 retry it; choose another approach or ask the user.",
                crate::settings::config_path().display()
            ),
        };
    }
    if matched.is_empty() {
        return Decision::Allow {
            approved_by: "not dangerous",
        };
    }
    if settings.mode == ApprovalMode::Off {
        return Decision::Allow {
            approved_by: "mode off",
        };
    }
    let allow = permanent_allowlist();
    if allowlisted(&allow, &views, &matched) {
        return Decision::Allow {
            approved_by: "allowlist",
        };
    }
    let sid = session_key(ctx.task_id.as_deref());
    let pending: Vec<&DangerousPattern> = {
        let approved = SESSION_APPROVALS
            .lock()
            .map(|g| g.clone())
            .unwrap_or_default();
        matched
            .into_iter()
            .filter(|p| !allowlist_approves(&allow, &views, p))
            .filter(|p| !approved.contains(&(sid.clone(), p.key.clone())))
            .collect()
    };
    if pending.is_empty() {
        return Decision::Allow {
            approved_by: "session",
        };
    }
    let req = ApprovalRequest {
        command: command.to_string(),
        task_id: ctx.task_id.clone(),
        origin: ctx.origin,
        matches: pending
            .iter()
            .map(|p| (p.key.clone(), p.description.clone()))
            .collect(),
        is_script,
        execution_ended: crate::call_scope::ended_flag(ctx),
        dir: dir.map(std::path::Path::to_path_buf),
    };
    let smart = SMART_APPROVAL.read().ok().and_then(|g| g.clone());
    if let Some(smart) = smart {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| smart(&req))).unwrap_or(false) {
            return Decision::Allow {
                approved_by: "smart",
            };
        }
    }
    if settings.mode == ApprovalMode::Smart {
        match approval_policy::smart_verdict(&req, &settings) {
            SmartVerdict::Approve => {
                return Decision::Allow {
                    approved_by: "smart",
                }
            }
            SmartVerdict::Deny => {
                return Decision::Deny {
                    message: format!(
                        "{what} denied by the smart approver: it matches {}. Do not retry it; \
                         choose a safer approach or ask the user.",
                        describe(&req)
                    ),
                }
            }
            SmartVerdict::Escalate => {}
        }
    }
    let mut host = HOST_CALLBACK.read().ok().and_then(|g| g.clone());
    if host.is_some() {
        if let Err(reason) = host_reachable(ctx.task_id.as_deref()) {
            // A terminal can stand in for a host that cannot reach anyone, for a script's
            // commands as for direct calls (the whole-script guard asks there too).
            if !interactive() {
                return Decision::Deny {
                    message: format!("{} ({reason})", non_interactive_message(&req)),
                };
            }
            host = None;
        }
    }
    let answer = if let Some(host) = host {
        approval_policy::ask_host(host, &req, settings.timeout)
    } else if interactive() {
        // On an interactive terminal, direct agent calls and a script's commands alike are
        // asked. A script approved "once" at the whole-script guard has its commands asked
        // about again — as the Python and MCP hosts do — rather than denied as non-interactive
        // in the very session that just answered: the guard saw only the script's text, the
        // person now sees each command. A person has approvals.timeout too; silence denies.
        let asked = req.clone();
        match approval_policy::within(settings.timeout, move || tty_prompt(&asked)) {
            Ok(answer) => answer,
            Err(approval_policy::Unfinished::TimedOut) => Err(NoAnswer::TimedOut(settings.timeout)),
            Err(e) => Err(NoAnswer::NoInput(e.to_string())),
        }
    } else {
        return Decision::Deny {
            message: non_interactive_message(&req),
        };
    };
    let choice = match answer {
        Ok(choice) => choice,
        Err(why) => {
            return Decision::Deny {
                message: format!(
                    "{what} not run: {why}. That counts as a denial, though nobody denied it. \
                     It matches {}.",
                    describe(&req)
                ),
            }
        }
    };
    match choice {
        ApprovalChoice::Deny => Decision::Deny {
            message: format!(
                "{what} denied by the user: it matches {}. Do not retry it; choose a safer \
                 command or ask the user.",
                describe(&req)
            ),
        },
        ApprovalChoice::Once => Decision::Allow {
            approved_by: "user",
        },
        ApprovalChoice::Session | ApprovalChoice::Always => {
            if let Ok(mut g) = SESSION_APPROVALS.lock() {
                for (k, _) in &req.matches {
                    g.insert((sid.clone(), k.clone()));
                }
            }
            if choice == ApprovalChoice::Always {
                let keys: Vec<String> = req.matches.iter().map(|(k, _)| k.clone()).collect();
                if let Err(e) = persist_always(&keys) {
                    tracing::warn!("approval: could not save to command_allowlist: {e}");
                }
            }
            Decision::Allow {
                approved_by: "user",
            }
        }
    }
}

fn describe(req: &ApprovalRequest) -> String {
    req.matches
        .iter()
        .map(|(k, d)| format!("{d} [{k}]"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn non_interactive_message(req: &ApprovalRequest) -> String {
    let keys: Vec<&str> = req.matches.iter().map(|(k, _)| k.as_str()).collect();
    format!(
        "Command not run: it matches a dangerous pattern ({}) and there is no one to approve it \
         (non-interactive{}). To allow it, add {} to `command_allowlist` in {}, or run it from an \
         interactive session.",
        describe(req),
        if req.origin == CallOrigin::Script {
            ": called from an execute_code script without a host approval callback"
        } else {
            ""
        },
        keys.join(", "),
        crate::settings::config_path().display()
    )
}

/// Whether a human can be asked on this process's terminal: stdin and stderr are TTYs and the
/// environment is not CI.
fn interactive() -> bool {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        return false;
    }
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Asks on the controlling terminal. No terminal or end of input is [`NoAnswer::NoInput`];
/// an unclear answer is the person's denial.
fn tty_prompt(req: &ApprovalRequest) -> ApprovalAnswer {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| NoAnswer::NoInput(format!("cannot open /dev/tty: {e}")))?;
    let mut out = tty
        .try_clone()
        .map_err(|e| NoAnswer::NoInput(format!("cannot use /dev/tty: {e}")))?;
    let what = if req.is_script { "script" } else { "command" };
    let _ = writeln!(
        out,
        "\n⚠️  Dangerous {what}: {}\n    matches: {}\n    Run it? [o]nce / [s]ession / [a]lways / [d]eny: ",
        shown_to_a_person(&req.command),
        shown_to_a_person(&describe(req))
    );
    let _ = out.flush();
    let mut line = String::new();
    match std::io::BufReader::new(tty).read_line(&mut line) {
        Ok(0) => Err(NoAnswer::NoInput("end of input".into())),
        Ok(_) => Ok(parse_choice(&line)),
        Err(e) => Err(NoAnswer::NoInput(e.to_string())),
    }
}

/// Parses the answer of a form or callback that was offered exactly `once`, `session`,
/// `always` and `deny` (an MCP elicitation's enum, the Python callback's words): those words
/// (any case, surrounding blanks ignored) and nothing else. The terminal prompt's shortcuts
/// (`y`, `a`, …) are not among them: a client that answered `a` outside the form's enum wrote
/// `always` into config.yaml.
pub fn parse_offered_choice(answer: &str) -> Option<ApprovalChoice> {
    match answer.trim().to_ascii_lowercase().as_str() {
        "once" => Some(ApprovalChoice::Once),
        "session" => Some(ApprovalChoice::Session),
        "always" => Some(ApprovalChoice::Always),
        "deny" => Some(ApprovalChoice::Deny),
        _ => None,
    }
}

/// Parses an answer to the terminal's approval prompt; anything unclear is a denial.
pub fn parse_choice(answer: &str) -> ApprovalChoice {
    match answer.trim().to_ascii_lowercase().as_str() {
        "o" | "once" | "y" | "yes" => ApprovalChoice::Once,
        "s" | "session" => ApprovalChoice::Session,
        "a" | "always" => ApprovalChoice::Always,
        _ => ApprovalChoice::Deny,
    }
}

/// `command_allowlist` of config.yaml (empty when absent or unreadable).
pub fn permanent_allowlist() -> Vec<String> {
    crate::settings::current_or_default()
        .command_allowlist
        .clone()
        .unwrap_or_default()
}

/// Whether `command_allowlist` approves every one of `matched` ([`allowlist_approves`]).
fn allowlisted(allow: &[String], views: &[String], matched: &[&DangerousPattern]) -> bool {
    matched.iter().all(|p| allowlist_approves(allow, views, p))
}

/// Whether `command_allowlist` approves pattern `p` in `command`: its key is listed, or a glob
/// entry matches, as a whole, one command of the line (`*` stops at `;`, `&&`, `||`, `|`, `&`
/// and at subshells and substitutions) and every place `p` matches lies inside such a command
/// and starts where it starts: the danger is the command's own. So `git push *` approves the
/// force push of `git push -f x; curl … | sh` but not the `curl | sh`, which still needs its
/// own approval: an entry approves one command, never what is chained to it — nor what its
/// arguments carry (`git push --receive-pack='rm -rf ~' …`, a redirect `> /etc/hosts`).
fn allowlist_approves(allow: &[String], views: &[String], p: &DangerousPattern) -> bool {
    if allow.iter().any(|a| a == &p.key) {
        return true;
    }
    let globs: Vec<Regex> = allow
        .iter()
        .filter(|a| a.contains(['*', '?', '[', ' ']))
        .filter_map(|a| {
            Regex::new(&format!(
                "{COMMAND_START}({}){COMMAND_END}",
                glob_regex(a, false)
            ))
            .ok()
        })
        .collect();
    if globs.is_empty() {
        return false;
    }
    let mut hit_somewhere = false;
    for view in views {
        if !p.hits(view) {
            continue;
        }
        hit_somewhere = true;
        let mut regions = Vec::new();
        for re in &globs {
            let mut pos = 0;
            while let Some(c) = re.captures_at(view, pos) {
                let (Some(whole), Some(inner)) = (c.get(0), c.get(1)) else {
                    break;
                };
                regions.push(inner.range());
                // Resume at the end of the command, not of the separator after it, so the
                // next command of the line can match too.
                pos = inner.end().max(whole.start() + 1);
                if pos > view.len() {
                    break;
                }
            }
        }
        let inside = p.regex.find_iter(view).all(|m| {
            regions
                .iter()
                .any(|r| r.start == m.start() && m.end() <= r.end)
        });
        if !inside {
            return false;
        }
    }
    hit_somewhere
}

/// `s` as a YAML scalar: plain when it is a simple word, else double-quoted (a JSON string is
/// a valid YAML double-quoted scalar), so a glob such as `rm -rf *: x` cannot break the file.
fn yaml_scalar(s: &str) -> Result<String, String> {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if plain {
        Ok(s.to_string())
    } else {
        serde_json::to_string(s).map_err(|e| format!("cannot write YAML: {e}"))
    }
}

/// Adds `keys` to `command_allowlist` in config.yaml.
///
/// When the file has no `command_allowlist` yet, a block is appended as text, so comments and
/// formatting of the rest of the file are kept exactly. When the key exists, the YAML document
/// is edited and written back: every other key and value is kept, but comments are lost (the
/// YAML library does not keep them). The file is replaced atomically.
pub fn persist_always(keys: &[String]) -> Result<(), String> {
    let path = crate::settings::config_path();
    // A config that is not a regular file (`--config <(...)`, a FIFO, a device) was read once
    // at start and cannot be rewritten: the approval holds for this session only.
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "{} is not a regular file (a pipe or a device), so an \"always\" approval cannot \
             be written into it; it holds for this session only",
            path.display()
        ));
    }
    let text = match crate::config_file::read_text(&path) {
        Ok(Some(read)) => read.text,
        Ok(None) => String::new(),
        Err(e) => return Err(e.to_string()),
    };
    // The file must be a valid config before it is rewritten: an "always" never turns a
    // broken file into a different broken file.
    let parsed = crate::config_file::ConfigFile::parse(&text, &path).map_err(|e| e.to_string())?;
    let new_text = match parsed.command_allowlist {
        None => {
            let mut t = text.clone();
            if !t.is_empty() && !t.ends_with('\n') {
                t.push('\n');
            }
            t.push_str("command_allowlist:\n");
            for k in keys {
                t.push_str(&format!("  - {}\n", yaml_scalar(k)?));
            }
            t
        }
        Some(existing) => {
            let mut doc: serde_json::Value = serde_saphyr::from_str(&text)
                .map_err(|e| format!("{} is not valid YAML: {e}", path.display()))?;
            let map = doc
                .as_object_mut()
                .ok_or_else(|| format!("{} is not a YAML mapping", path.display()))?;
            let mut list = existing;
            for k in keys {
                if !list.contains(k) {
                    list.push(k.clone());
                }
            }
            map.insert("command_allowlist".into(), serde_json::json!(list));
            serde_saphyr::to_string(&doc).map_err(|e| format!("cannot write YAML: {e}"))?
        }
    };
    // A config.yaml that is a symlink (kept in a dotfiles repository) is rewritten where it
    // points, and a replaced file keeps its mode and owner: the rename would otherwise turn
    // the link into a file of its own and the file into a private 0600 one.
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let existing = std::fs::metadata(&path).ok();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(&parent)
        .map_err(|e| format!("cannot write beside {}: {e}", path.display()))?;
    tmp.write_all(new_text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if let Some(m) = &existing {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        // Best effort: only root may give a file away, and then it should.
        let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(m.uid()), Some(m.gid()));
    }
    tmp.persist(&path)
        .map_err(|e| format!("cannot replace {}: {}", path.display(), e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests;
