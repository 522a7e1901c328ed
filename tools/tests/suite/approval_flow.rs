//! The approval decision chain end to end, through the real `terminal` tool and a real
//! config.yaml. One test function: the callbacks, session approvals and config path are
//! process-wide, so the steps must run in order.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use vibeos_tools::approval::{self, ApprovalChoice, ApprovalRequest, Decision};
use vibeos_tools::{registry, CallOrigin, ToolContext};

fn terminal(ctx: &ToolContext, cmd: &str) -> Value {
    let text = registry().handle_function_call("terminal", &json!({"command": cmd}), ctx);
    serde_json::from_str(&text).unwrap()
}

#[test]
fn decision_chain_host_session_always_smart_and_agent_env() {
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "# my settings\ncode_execution:\n  timeout: 30\n").unwrap();
    vibeos_tools::settings::set_config_path(Some(cfg.clone()));
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut ctx = ToolContext::agent(&work);
    ctx.task_id = Some("session-1".into());
    ctx.origin = CallOrigin::Script;
    let mk = |name: &str| {
        std::fs::create_dir_all(work.join(name)).unwrap();
        std::fs::write(work.join(name).join("f"), "x").unwrap();
    };

    // No host, script origin: denied, nothing run.
    mk("d1");
    let r = terminal(&ctx, "rm -rf d1");
    assert!(
        r["error"].as_str().unwrap().contains("non-interactive"),
        "{r}"
    );
    assert!(work.join("d1").exists());

    // Host callback says deny, then once.
    let asked = Arc::new(AtomicUsize::new(0));
    let answer = Arc::new(std::sync::Mutex::new(ApprovalChoice::Deny));
    {
        let asked = Arc::clone(&asked);
        let answer = Arc::clone(&answer);
        approval::set_approval_callback(Some(Arc::new(move |req: &ApprovalRequest| {
            asked.fetch_add(1, Ordering::SeqCst);
            assert!(req
                .task_id
                .as_deref()
                .is_some_and(|t| t.starts_with("session-")));
            *answer.lock().unwrap()
        })));
    }
    let r = terminal(&ctx, "rm -rf d1");
    assert!(
        r["error"].as_str().unwrap().contains("denied by the user"),
        "{r}"
    );
    assert!(work.join("d1").exists());
    *answer.lock().unwrap() = ApprovalChoice::Once;
    assert_eq!(terminal(&ctx, "rm -rf d1")["exit_code"], 0);
    assert!(!work.join("d1").exists());
    assert_eq!(asked.load(Ordering::SeqCst), 2);

    // "session": remembered for this session and pattern only.
    *answer.lock().unwrap() = ApprovalChoice::Session;
    mk("d2");
    mk("d3");
    assert_eq!(terminal(&ctx, "rm -rf d2")["exit_code"], 0);
    assert_eq!(terminal(&ctx, "rm -rf d3")["exit_code"], 0);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        3,
        "session approval was not remembered"
    );
    let mut other = ctx.clone();
    other.task_id = Some("session-2".into());
    *answer.lock().unwrap() = ApprovalChoice::Deny;
    mk("d4");
    assert!(terminal(&other, "rm -rf d4")["error"].is_string());
    assert_eq!(asked.load(Ordering::SeqCst), 4);

    // "always": written to command_allowlist, the rest of the file kept (comments too, since
    // the key was new).
    *answer.lock().unwrap() = ApprovalChoice::Always;
    std::fs::create_dir_all(work.join("repo")).unwrap();
    let r = terminal(&other, "git clean -fdx -n 2>/dev/null; true");
    assert_eq!(r["exit_code"], 0, "{r}");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.starts_with("# my settings\ncode_execution:\n  timeout: 30\n"),
        "{text}"
    );
    assert!(
        text.contains("command_allowlist:\n  - git_clean\n"),
        "{text}"
    );
    approval::set_approval_callback(None);
    let mut fresh = ctx.clone();
    fresh.task_id = Some("session-3".into());
    assert_eq!(
        terminal(&fresh, "git clean -fdx -n 2>/dev/null; true")["exit_code"],
        0
    );
    // A second "always" edits the existing list and keeps the other keys.
    approval::persist_always(&["recursive_delete".into()]).unwrap();
    let doc: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    assert_eq!(doc["code_execution"]["timeout"], 30);
    assert_eq!(doc["command_allowlist"][1], "recursive_delete");
    std::fs::write(&cfg, "command_allowlist: []\n").unwrap();

    // Smart approval: low-risk cleanups pass without asking, others are still refused.
    approval::set_smart_approval(Some(Arc::new(approval::low_risk_cleanup)));
    mk("node_modules");
    assert_eq!(terminal(&fresh, "rm -rf node_modules/")["exit_code"], 0);
    assert!(!work.join("node_modules").exists());
    mk("src");
    assert!(terminal(&fresh, "rm -rf src")["error"].is_string());
    assert!(work.join("src").exists());
    approval::set_smart_approval(None);
    assert!(matches!(
        approval::check_command("ls", &fresh),
        Decision::Allow {
            approved_by: "not dangerous"
        }
    ));

    // Agent calls (ctx.env None) keep the environment minus provider credentials.
    std::env::set_var("OPENAI_API_KEY", "sk-provider-secret");
    std::env::set_var("MY_TOOL_TOKEN", "agent-visible");
    let agent = ToolContext::agent(&work);
    let out = terminal(&agent, "env")["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!out.contains("sk-provider-secret"));
    // The command gets the user's secret-looking variable; its value is redacted from the
    // output the model sees (security.redact_output).
    assert!(
        out.contains("MY_TOOL_TOKEN=[REDACTED:MY_TOOL_TOKEN]"),
        "{out}"
    );
    let seen = terminal(
        &agent,
        "test \"$MY_TOOL_TOKEN\" = agent-visible && echo present",
    );
    assert_eq!(seen["output"], "present\n");

    // A config.yaml that is a symlink into a dotfiles dir: "always" writes the file it points
    // at, which keeps its mode, and the link stays a link (stop 50's probe: the link was
    // replaced by a new 0600 file and the dotfiles copy left unchanged).
    {
        use std::os::unix::fs::PermissionsExt;
        let dotfiles = work.join("dotfiles");
        std::fs::create_dir_all(&dotfiles).unwrap();
        let real = dotfiles.join("config.yaml");
        std::fs::write(&real, "code_execution:\n  timeout: 30\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = work.join("linked-config.yaml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        vibeos_tools::settings::set_config_path(Some(link.clone()));
        approval::persist_always(&["git_clean".into()]).unwrap();
        vibeos_tools::settings::set_config_path(None);
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(std::fs::read_to_string(&real)
            .unwrap()
            .contains("command_allowlist:\n  - git_clean\n"));
        let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    // A config read from a pipe (`--config <(...)`) cannot take an "always": refused with
    // the reason, not written beside it or over it.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(writer);
    let pipe = std::path::PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&reader)
    ));
    vibeos_tools::settings::set_config_path(Some(pipe));
    let e = vibeos_tools::approval::persist_always(&["recursive_delete".into()]).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    assert!(e.contains("this session only"), "{e}");
    drop(reader);
    vibeos_tools::settings::set_config_path(None);
}
