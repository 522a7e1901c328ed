//! `approvals.*` (SPEC §8): the hardline tier no mode, callback or allowlist can approve, user
//! deny rules, `approvals.mode: off | smart`, the smart approver (Rust hook and configured
//! command) and `approvals.timeout`. One test function: callbacks and the config path are
//! process-wide, so the steps run in order.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vibeos_tools::approval::{self, ApprovalChoice, ApprovalRequest, Decision};
use vibeos_tools::approval_policy::{self, SmartVerdict};
use vibeos_tools::{registry, CallOrigin, ToolContext};

fn terminal(ctx: &ToolContext, cmd: &str) -> Value {
    let text = registry().handle_function_call("terminal", &json!({"command": cmd}), ctx);
    serde_json::from_str(&text).unwrap()
}

fn denied(d: &Decision) -> &str {
    match d {
        Decision::Deny { message } => message,
        Decision::Allow { approved_by } => panic!("allowed by {approved_by}"),
    }
}

#[test]
fn hardline_deny_rules_modes_smart_and_timeout() {
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    let set = |text: &str| std::fs::write(&cfg, text).unwrap();
    vibeos_tools::settings::set_config_path(Some(cfg.clone()));
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut ctx = ToolContext::agent(&work);
    ctx.task_id = Some("modes".into());
    ctx.origin = CallOrigin::Script;
    let mk = |name: &str| {
        std::fs::create_dir_all(work.join(name)).unwrap();
        std::fs::write(work.join(name).join("f"), "x").unwrap();
    };

    // approvals.mode: off runs dangerous commands without asking ...
    set("approvals:\n  mode: off\ncommand_allowlist:\n  - root_delete\n  - recursive_delete\n  - kill_all\n  - fork_bomb\n");
    mk("d1");
    let r = terminal(&ctx, "rm -rf d1");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(!work.join("d1").exists());
    // ... but never the hardline tier: not with mode off, not allowlisted, not with a host
    // that answers "always" (which is never even asked).
    let asked = Arc::new(AtomicUsize::new(0));
    {
        let asked = Arc::clone(&asked);
        approval::set_approval_callback(Some(Arc::new(move |_: &ApprovalRequest| {
            asked.fetch_add(1, Ordering::SeqCst);
            ApprovalChoice::Always
        })));
    }
    for cmd in [
        "rm -rf /",
        "kill -9 -1",
        ":(){ :|:& };:",
        "/bin/rm -r -f /*",
    ] {
        let d = approval::check_command(cmd, &ctx);
        let msg = denied(&d);
        assert!(
            msg.contains("hardline") && msg.contains("no approval"),
            "{cmd}: {msg}"
        );
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "the host was asked about a hardline command"
    );
    // Through the tool: refused, with the hardline message, and the tool never spawned it.
    let r = terminal(&ctx, "kill -9 -1");
    assert!(r["error"].as_str().unwrap().contains("hardline"), "{r}");

    // User deny rules refuse even harmless commands, in any mode.
    set("approvals:\n  mode: off\n  deny:\n    - \"echo forbidden*\"\n    - git_force_push\n");
    let r = terminal(&ctx, "echo forbidden thing");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("deny rule `echo forbidden*`"),
        "{r}"
    );
    assert!(denied(&approval::check_command(
        "git push --force origin main",
        &ctx
    ))
    .contains("git_force_push"));
    assert_eq!(terminal(&ctx, "echo allowed")["output"], "allowed\n");
    // An edit that breaks the file while the host runs keeps the rules last read from it: a
    // deny rule is not lost to the defaults.
    set("approvals:\n  mode: off\n  deny:\n    - \"echo forbidden*\"\ncode_execution:\n  timeot: 5\n");
    let r = terminal(&ctx, "echo forbidden thing");
    assert!(r["error"].as_str().unwrap().contains("deny rule"), "{r}");
    assert_eq!(terminal(&ctx, "echo allowed")["output"], "allowed\n");
    // A file that has never parsed in this process: its rules are unknown, nothing runs.
    let never = dir.path().join("never-parsed.yaml");
    std::fs::write(&never, "approvals:\n  deny: [\"echo x*\"]\n  bogus: 1\n").unwrap();
    vibeos_tools::settings::set_config_path(Some(never));
    let r = terminal(&ctx, "echo allowed");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("approval rules cannot be read") && e.contains("bogus"),
        "{r}"
    );
    vibeos_tools::settings::set_config_path(Some(cfg.clone()));
    set("command_denylist:\n  - \"echo top-level*\"\n");
    let r = terminal(&ctx, "echo top-level deny");
    assert!(r["error"].as_str().unwrap().contains("deny rule"), "{r}");
    approval::set_approval_callback(None);

    // Smart mode, configured command: approve, deny, escalate (to a non-interactive denial).
    // Only the three words decide: "yes" escalates (stop 53; it used to approve).
    for (answer, ran) in [
        ("approve", true),
        ("DENY", false),
        ("hmm", false),
        ("yes", false),
    ] {
        set(&format!(
            "approvals:\n  mode: smart\n  smart_command: \"cat >/dev/null; echo {answer}\"\n"
        ));
        mk("d2");
        let r = terminal(&ctx, "rm -rf d2");
        assert_eq!(!work.join("d2").exists(), ran, "{answer}: {r}");
        if !ran {
            let e = r["error"].as_str().unwrap();
            let expect = if answer == "DENY" {
                "smart approver"
            } else {
                "non-interactive"
            };
            assert!(e.contains(expect), "{answer}: {e}");
        }
    }
    // Smart mode, Rust hook (wins over the command), sees the request.
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    {
        let seen = Arc::clone(&seen);
        approval_policy::set_smart_approver(Some(Arc::new(move |req: &ApprovalRequest| {
            *seen.lock().unwrap() = req.command.clone();
            if req.command.contains("scratch") {
                SmartVerdict::Approve
            } else {
                SmartVerdict::Escalate
            }
        })));
    }
    mk("scratch");
    let r = terminal(&ctx, "rm -rf scratch");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(*seen.lock().unwrap(), "rm -rf scratch");
    approval_policy::set_smart_approver(None);
    // Smart mode without an approver: the built-in low-risk rule.
    set("approvals:\n  mode: smart\n");
    mk("node_modules");
    assert_eq!(terminal(&ctx, "rm -rf node_modules/")["exit_code"], 0);
    assert!(!work.join("node_modules").exists());

    // approvals.timeout: a host that does not answer in time is a denial.
    set("approvals:\n  timeout: 0.5\n");
    approval::set_approval_callback(Some(Arc::new(|_: &ApprovalRequest| {
        std::thread::sleep(Duration::from_secs(3));
        ApprovalChoice::Once
    })));
    mk("d3");
    let started = Instant::now();
    let r = terminal(&ctx, "rm -rf d3");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the timeout was not applied"
    );
    assert!(
        r["error"].as_str().unwrap().contains("approvals.timeout"),
        "{r}"
    );
    assert!(work.join("d3").exists());
    approval::set_approval_callback(None);
    vibeos_tools::settings::set_config_path(None);
}

#[test]
fn writing_the_config_by_its_literal_path_is_asked_about() {
    // Stop 53: `> $VIBEOS_HOME/config.yaml` was caught, the same path spelled out was not,
    // and turned approvals off for the rest of the execution.
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("vibeos-home");
    std::fs::create_dir_all(&home).unwrap();
    let cfg = home.join("config.yaml");
    std::fs::write(&cfg, "approvals:\n  mode: manual\n").unwrap();
    vibeos_tools::settings::set_config_path(Some(cfg.clone()));
    let dangerous = |cmd: &str| {
        approval::detect_dangerous(cmd)
            .unwrap()
            .iter()
            .any(|p| p.key == "vibeos_config_write")
    };
    let home_text = home.display().to_string();
    let real = std::fs::canonicalize(&home).unwrap().display().to_string();
    for cmd in [
        format!("echo 'approvals: {{mode: off}}' > {}", cfg.display()),
        format!("echo 'approvals: {{mode: off}}' > {home_text}/./config.yaml"),
        format!("cp evil.yaml {real}/config.yaml"),
        format!("tee -a {home_text}/config.yaml < x"),
        format!("sed -i s/manual/off/ {home_text}/config.yaml"),
    ] {
        assert!(dangerous(&cmd), "{cmd}");
    }
    for cmd in [
        format!("cat {}", cfg.display()),
        format!("echo x > {home_text}-other/config.yaml"),
    ] {
        assert!(!dangerous(&cmd), "{cmd}");
    }
    // Spelled another way, found through the filesystem from where the command starts
    // (the verification probe of stop 53): relative, through a link, `$PWD`, `/proc/self/cwd`.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::os::unix::fs::symlink(&cfg, dir.path().join("cfglink")).unwrap();
    std::os::unix::fs::symlink(&home, dir.path().join("homelink")).unwrap();
    let ctx = ToolContext::agent(&work);
    for cmd in [
        "echo '#x' >> ../vibeos-home/config.yaml",
        "echo '#x' >> ./../vibeos-home/./config.yaml",
        "echo '#x' >> ../cfglink",
        "tee -a ../homelink/config.yaml < /dev/null",
        "echo '#x' >> $PWD/../vibeos-home/config.yaml",
        "sed -i 's/manual/off/' ../vibeos-home/config.yaml",
    ] {
        let d = approval::check_command_in(cmd, &work, &ctx);
        assert!(
            matches!(&d, Decision::Deny { message } if message.contains("vibeos_config_write")),
            "{cmd}: {d:?}"
        );
    }
    // Reading it, or writing beside it, is not a write of it.
    for cmd in ["cat ../cfglink", "echo x > ../vibeos-home-notes.txt"] {
        let d = approval::check_command_in(cmd, &work, &ctx);
        assert!(matches!(d, Decision::Allow { .. }), "{cmd}: {d:?}");
    }
    // Through the terminal tool, non-interactive: refused, the file unchanged.
    let ctx = ToolContext::agent(dir.path());
    let r = terminal(
        &ctx,
        &format!("echo 'approvals: {{mode: off}}' > {}", cfg.display()),
    );
    assert!(
        r["error"]
            .as_str()
            .unwrap_or("")
            .contains("non-interactive"),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(&cfg).unwrap(),
        "approvals:\n  mode: manual\n"
    );
    vibeos_tools::settings::set_config_path(None);
}
