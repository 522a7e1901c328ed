//! What a script's commands leave when this process dies without cleaning up.
//!
//! A script's `terminal` commands are children of the supervisor, not of the script's reaper,
//! and the execution's end kills them ([`super::local::kill_scope`]). A supervisor killed with
//! SIGKILL (or by the OOM killer) never reaches that end: its commands were reparented to init
//! and ran on, and their shell-session dirs stayed in `TMPDIR`.
//!
//! The keeper is one small `sh` per process, started with the first scoped command or session
//! dir. Its stdin is a lifeline pipe whose write end only this process holds (close-on-exec),
//! and on it the process names each shell-session dir it makes. When the pipe reaches EOF —
//! this process has exited, however it ended — the keeper kills every process whose environment
//! carries this process's scope marker prefix ([`super::local::SCOPE_VAR`]) and removes the dirs
//! it was told of. After a normal exit both were already done, and the keeper finds nothing.
//!
//! Why a shell and not a fork of this process: a fork would keep a copy-on-write image of the
//! supervisor (a Python host's whole heap) for the supervisor's lifetime, and every page the
//! supervisor rewrote afterwards would be paid twice. `sh`, `grep` and `rm` are on every machine
//! a local backend runs on; where they are not, the keeper is not started and nothing else
//! changes (logged at debug).
//!
//! Rejected: `PR_SET_PDEATHSIG` on each command's shell. It reaches the shell only (not what it
//! started), and it fires when the *thread* that spawned the command exits, which in a thread
//! pool is not the process's death.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The keeper's script. `$1` is the marker prefix. The lifeline's lines are dir paths; EOF is
/// the signal to act. Each round greps every process's environment once (`-z`: one entry per
/// "line", so `^` anchors at an entry's start), kills what matched, and repeats while something
/// did: a process being killed may have started another meanwhile. grep's status is not used:
/// a process that ended during the scan makes it 2 even when it matched others.
const SCRIPT: &str = r#"dirs=
while IFS= read -r dir; do dirs="$dirs
$dir"; done
needle="^VIBEOS_EXECUTION_SCOPE=$1"
rounds=0
while [ $rounds -lt 4 ]; do
  rounds=$((rounds + 1))
  found=$(grep -l -z -e "$needle" /proc/[0-9]*/environ 2>/dev/null)
  [ -n "$found" ] || break
  for f in $found; do p=${f#/proc/}; kill -9 "${p%/environ}" 2>/dev/null; done
done
printf '%s\n' "$dirs" | while IFS= read -r dir; do
  case "$dir" in /*/vibeos-shell-*) rm -rf -- "$dir" 2>/dev/null ;; esac
done
"#;

/// The lifeline's write end, once the keeper runs; `None` when it could not be started.
static LIFELINE: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();

/// Starts the keeper if it is not running yet. `marker_prefix` is the part of
/// [`super::local::SCOPE_VAR`]'s value shared by every execution of this process.
pub fn ensure(marker_prefix: &str) {
    LIFELINE.get_or_init(|| match start(marker_prefix) {
        Ok(lifeline) => Some(Mutex::new(lifeline)),
        Err(e) => {
            tracing::debug!(
                "terminal: no keeper for commands left by a killed supervisor ({e}); they end \
                 with their execution as before, but not if this process is killed"
            );
            None
        }
    });
}

/// Tells the keeper to remove `dir` if this process dies without removing it. A path the
/// keeper's line protocol cannot carry (a newline in it) is not sent.
pub fn remove_if_we_die(dir: &Path, marker_prefix: &str) {
    ensure(marker_prefix);
    let Some(text) = dir.to_str().filter(|t| !t.contains('\n')) else {
        return;
    };
    if let Some(Some(lifeline)) = LIFELINE.get() {
        if let Ok(mut w) = lifeline.lock() {
            let _ = writeln!(w, "{text}");
        }
    }
}

fn start(marker_prefix: &str) -> std::io::Result<std::fs::File> {
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Command::new("/bin/sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("vibeos-command-keeper")
        .arg(marker_prefix)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group: a Ctrl-C meant for the supervisor's group must not end it first.
        .process_group(0)
        .spawn()?;
    // The child is not waited for: it lives as long as this process and is reaped by init
    // after it, like the reapers of a killed supervisor.
    Ok(std::fs::File::from(write_end))
}
