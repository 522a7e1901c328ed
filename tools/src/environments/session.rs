//! Shell-session semantics for `terminal` (SPEC §9): the working directory and exported
//! variables of one call are seen by the next call of the same task, as agents trained on the
//! system this product replaces expect (`cd build` then `make`).
//!
//! Each command still runs in a fresh `bash -c` (so timeouts, process-group kills and output
//! capture stay exactly as they are); the command is wrapped to restore the session's state
//! first and to save `pwd` and `export -p` on exit. A long-lived shell per task would keep
//! state for free but makes timeouts, output framing and kill semantics fragile. State is kept
//! per task, per caller (agent or script) and per base directory (the call's session working
//! dir): a script never inherits the variables the agent's unscrubbed environment exported, and
//! vice versa, and a host that moves a task to another directory starts a fresh session there
//! rather than being pulled back into the old one. Like the task's environment (a container, an
//! ssh host), a task's session outlives one execution: a later script of the same task starts
//! where the last one left off. The same code runs in the tool agent, so
//! every backend gets the same semantics. `terminal.shell_session: false` turns it off.

use super::local::SCOPE_VAR;
use crate::{CallOrigin, ToolContext};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

static ENABLED: AtomicBool = AtomicBool::new(true);
/// Session key: task id, whether the caller is a script, and the base working dir.
type SessionKey = (String, bool, PathBuf);

static STATES: LazyLock<Mutex<BTreeMap<SessionKey, tempfile::TempDir>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// Turns shell sessions on or off for this process (`terminal.shell_session`).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::SeqCst);
}

/// Whether shell sessions are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Forgets every session and removes its state (host exit).
pub fn clear_all() {
    if let Ok(mut g) = STATES.lock() {
        g.clear();
    }
}

/// Registered once, with the first state dir: the map is a static and never dropped, so a host
/// that does not call [`clear_all`] (the Python package, any embedder) would leave every
/// session's dir, with the variables its commands exported, in TMPDIR after it exits.
static AT_EXIT: std::sync::Once = std::sync::Once::new();

extern "C" fn clear_at_exit() {
    // Never block at exit: a lock held by a thread that exit() froze would hang the process.
    if let Ok(mut g) = STATES.try_lock() {
        g.clear();
    }
}

fn session_key(ctx: &ToolContext) -> SessionKey {
    (
        ctx.task_id.clone().unwrap_or_default(),
        ctx.origin == CallOrigin::Script,
        ctx.cwd.clone(),
    )
}

/// The state dir of the call's session, created on first use; `None` when sessions are off
/// or the dir cannot be made (the command then runs without session state).
fn state_dir(ctx: &ToolContext) -> Option<PathBuf> {
    if !enabled() {
        return None;
    }
    let key = session_key(ctx);
    let mut g = STATES.lock().ok()?;
    if let Some(d) = g.get(&key) {
        return Some(d.path().to_path_buf());
    }
    let dir = tempfile::Builder::new()
        .prefix("vibeos-shell-")
        .tempdir()
        .map_err(|e| tracing::warn!("terminal: cannot keep shell-session state: {e}"))
        .ok()?;
    let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700));
    let path = dir.path().to_path_buf();
    super::keeper::remove_if_we_die(&path, super::local::marker_prefix());
    g.insert(key, dir);
    crate::exit_hook::register(
        &AT_EXIT,
        clear_at_exit,
        "terminal's shell-session dirs may be left in TMPDIR at exit",
    );
    Some(path)
}

/// The directory the call's session is in now (where its last command left it), if sessions
/// are on and a command of the session has run.
pub fn current_dir(ctx: &ToolContext) -> Option<PathBuf> {
    if !enabled() {
        return None;
    }
    let key = session_key(ctx);
    let file = STATES.lock().ok()?.get(&key)?.path().join("cwd");
    let text = std::fs::read_to_string(file).ok()?;
    let dir = PathBuf::from(text.strip_suffix('\n').unwrap_or(&text));
    dir.is_absolute().then_some(dir)
}

/// `command` wrapped to restore and save the session state; unchanged when sessions are off.
/// With `explicit_workdir` the call's `workdir` wins over the session's directory and is not
/// remembered as the session's directory.
pub fn wrap(command: &str, ctx: &ToolContext, explicit_workdir: bool) -> String {
    let Some(dir) = state_dir(ctx) else {
        return command.to_string();
    };
    let q = super::shell_quote(&dir.display().to_string());
    // A saved dir that is gone (removed by an earlier command) leaves the command in the
    // call's own dir: said on stderr, or a relative `rm`/`mv` acts where the agent does not
    // think it is.
    let restore_cwd = if explicit_workdir {
        String::new()
    } else {
        "if [ -f \"$__vibeos_s/cwd\" ] && IFS= builtin read -r -d '' __vibeos_d < \"$__vibeos_s/cwd\"; [ -n \"${__vibeos_d-}\" ]; then cd -- \"${__vibeos_d%$'\\n'}\" 2>/dev/null || builtin printf '[terminal: the session directory %s is gone; this command runs in %s]\\n' \"${__vibeos_d%$'\\n'}\" \"$PWD\" >&2; fi; "
            .to_string()
    };
    // A call's `workdir` is a one-off override: it does not move the session.
    let save_cwd = if explicit_workdir {
        ""
    } else {
        "pwd >| \"$__vibeos_s/cwd\" 2>/dev/null; "
    };
    // Only what the session changed is saved: each variable whose value differs from the one
    // the command started with (the call's own, freshly scrubbed environment). Saving the whole
    // `export -p` replayed an earlier execution's environment into later ones: its scope marker
    // (so its end killed a later execution's commands, and a later execution's background jobs
    // outlived it), and values the later execution's scrubbing had dropped. The name lists go
    // through a file because `$(...)` would fork; `>|` because the command may set noclobber.
    // Only builtins and an `mv` found on a fixed PATH: the command may have exported a PATH
    // where nothing is found (its `export` was lost, and `mv: command not found` reached the
    // output). The save also runs after the command, not only from the EXIT trap, which a
    // command that sets a trap of its own replaces; an empty line before that call ends a
    // command whose last line ends in `\` (it would have taken the call as an argument). The
    // saved dir is read whole (`read -d ''`): `read -r` alone trimmed spaces at its ends and
    // stopped at a newline in the name.
    // Everything before the command is on the command's first line, so that the shell's
    // `line N` in an error message and `$LINENO` count the command's own lines: with the
    // restore on lines of its own, `terminal("5")` said `line 8: 5: command not found`. (bash
    // ignores an assignment to LINENO in `bash -c`.) The line is parsed whole before any of it
    // runs, which changes nothing the command could see: a syntax error on its first line
    // now keeps the restore from running too, and the shell exits with it either way.
    format!(
        "__vibeos_s={q}; \
         declare -A __vibeos_base=(); \
         if builtin compgen -e >| \"$__vibeos_s/n.$$\" 2>/dev/null && builtin mapfile -t __vibeos_names < \"$__vibeos_s/n.$$\"; then \
         for __vibeos_n in \"${{__vibeos_names[@]}}\"; do __vibeos_base[$__vibeos_n]=${{!__vibeos_n-}}; done; fi; \
         if [ -f \"$__vibeos_s/env\" ]; then . \"$__vibeos_s/env\" 2>/dev/null; fi; \
         {restore_cwd}\
         __vibeos_save() {{ __vibeos_rc=$?; [ -n \"${{__vibeos_saved-}}\" ] && exit $__vibeos_rc; __vibeos_saved=1; {save_cwd}\
         if builtin compgen -e >| \"$__vibeos_s/n.$$\" 2>/dev/null && builtin mapfile -t __vibeos_names < \"$__vibeos_s/n.$$\"; then \
         for __vibeos_n in \"${{__vibeos_names[@]}}\"; do case $__vibeos_n in PWD|OLDPWD|SHLVL|_|{SCOPE_VAR}) continue;; esac; \
         if [[ ! -v \"__vibeos_base[$__vibeos_n]\" || \"${{__vibeos_base[$__vibeos_n]-}}\" != \"${{!__vibeos_n-}}\" ]]; then builtin declare -p \"$__vibeos_n\"; fi; \
         done >| \"$__vibeos_s/n.$$\" 2>/dev/null && {{ PATH=/usr/local/bin:/usr/bin:/bin command mv -f \"$__vibeos_s/n.$$\" \"$__vibeos_s/env\" 2>/dev/null || command -p mv -f \"$__vibeos_s/n.$$\" \"$__vibeos_s/env\"; }}; fi; \
         exit $__vibeos_rc; }}; \
         trap __vibeos_save EXIT; \
         {command}\n\n\
         __vibeos_save\n"
    )
}
