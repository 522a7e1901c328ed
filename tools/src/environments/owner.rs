//! Who started a sandbox, written into its labels (docker) or tags (Modal, Daytona), so that
//! `vibeos-exec backends gc` can tell a crashed host's leftovers from a live host's sandboxes.
//!
//! Why a module of its own: the docker, daytona and modal backends write the same labels and
//! gc judges them by one rule. The owner is `PID:START` (the process id and its start time in
//! clock ticks since boot, so a reused pid is not mistaken for the owner). A cloud sandbox can
//! be reached from any machine, so it also names the machine that owns it: a pid says nothing
//! about another machine's processes, and gc leaves those sandboxes alone.

use serde_json::Value;

/// The label every sandbox of this product carries (`vibeos-exec=1`).
pub const PRODUCT: &str = "vibeos-exec";
/// The label naming the task.
pub const TASK: &str = "vibeos-exec.task";
/// The label naming the owning process (`PID:START`).
pub const OWNER: &str = "vibeos-exec.owner";
/// The label naming the owning machine (cloud sandboxes).
pub const HOST: &str = "vibeos-exec.host";
/// The label saying whether the sandbox outlives its host (`1`) or not (`0`).
pub const PERSISTENT: &str = "vibeos-exec.persistent";

/// This process as an owner: `PID:START`.
pub fn owner_label() -> String {
    let start = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| start_time(&s))
        .unwrap_or_default();
    format!("{}:{start}", std::process::id())
}

/// Field 22 of a `/proc/PID/stat` line (after the parenthesised command, which may hold spaces).
fn start_time(stat: &str) -> Option<String> {
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(19).map(str::to_string))
}

/// Whether the process an owner label names still runs on this machine (same pid, same start).
pub fn owner_alive(label: &str) -> bool {
    let Some((pid, start)) = label.split_once(':') else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| start_time(&s))
        .is_some_and(|s| s == start)
}

/// This machine's name in [`HOST`]: `/etc/machine-id`, else the kernel's host name.
pub fn host_label() -> String {
    ["/etc/machine-id", "/proc/sys/kernel/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The labels a cloud sandbox of `task` carries.
pub fn cloud_labels(task: &str, persistent: bool) -> Value {
    serde_json::json!({
        PRODUCT: "1",
        TASK: task,
        OWNER: owner_label(),
        HOST: host_label(),
        PERSISTENT: if persistent { "1" } else { "0" },
    })
}

/// What gc does with a cloud sandbox whose labels are `labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its host crashed (or, with `--all`, it is persistent): remove it.
    Remove,
    /// Keep it, for this reason.
    Keep(&'static str),
}

/// The gc rule for cloud sandboxes: a persistent one goes only with `all`; one of another
/// machine (or of no known machine) stays; one whose owner process is gone goes.
pub fn cloud_verdict(labels: &Value, all: bool) -> Verdict {
    let get = |k: &str| labels.get(k).and_then(Value::as_str).unwrap_or("");
    if get(PERSISTENT) == "1" {
        return if all {
            Verdict::Remove
        } else {
            Verdict::Keep("persistent; --all removes persistent ones")
        };
    }
    if get(HOST) != host_label() {
        return Verdict::Keep("started by another machine, whose processes gc cannot see");
    }
    if owner_alive(get(OWNER)) {
        Verdict::Keep("its host is running")
    } else {
        Verdict::Remove
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        assert!(owner_alive(&owner_label()));
        assert!(!owner_alive("999999999:1"));
        assert!(!owner_alive(""));
    }

    #[test]
    fn cloud_sandboxes_are_judged_by_owner_machine_and_persistence() {
        let mut l = cloud_labels("t", false);
        assert!(matches!(cloud_verdict(&l, false), Verdict::Keep(_)));
        l[OWNER] = "999999999:1".into();
        assert_eq!(cloud_verdict(&l, false), Verdict::Remove);
        l[HOST] = "another-machine".into();
        assert!(matches!(cloud_verdict(&l, true), Verdict::Keep(_)));
        let mut p = cloud_labels("t", true);
        p[OWNER] = "999999999:1".into();
        assert!(matches!(cloud_verdict(&p, false), Verdict::Keep(_)));
        assert_eq!(cloud_verdict(&p, true), Verdict::Remove);
    }
}
