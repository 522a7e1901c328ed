//! Direct agent `terminal` calls keep most of the environment (SPEC §4) but never the
//! credentials the product manages: model providers, tool services, execution backends and
//! messaging gateways (`provider_blocklist` in policies/env.json).
//!
//! Its own test binary: it sets process environment variables, which must not race other tests.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use vibeos_tools::{registry, ToolContext};

#[test]
fn agent_terminal_gets_no_managed_credentials() {
    let _process_state = super::process_state_lock();
    let managed = [
        ("GITHUB_TOKEN", "ghp_parityGithubValue000000000000000000"),
        ("GH_TOKEN", "gh-cli-parity-value"),
        ("MODAL_TOKEN_ID", "ak-parity-modal-id"),
        ("MODAL_TOKEN_SECRET", "as-parity-modal-secret"),
        ("DAYTONA_API_KEY", "dtn_parity_daytona"),
        ("TELEGRAM_BOT_TOKEN", "123456:parity-telegram"),
        ("SLACK_BOT_TOKEN", "xoxb-parity-slack"),
        ("DISCORD_BOT_TOKEN", "parity-discord-token"),
        ("OPENAI_API_KEY", "sk-parity-openai"),
    ];
    for (k, v) in managed {
        std::env::set_var(k, v);
    }
    // A user's own secret-looking variable still passes to a direct agent call (seeds'
    // behaviour): only managed credentials are removed.
    std::env::set_var("MY_PROJECT_TOKEN", "project-value-kept");
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let out: Value = serde_json::from_str(&registry().handle_function_call(
        "terminal",
        &json!({"command": "env"}),
        &ctx,
    ))
    .unwrap();
    let text = out["output"].as_str().unwrap();
    assert!(text.contains("MY_PROJECT_TOKEN="), "{text}");
    for (k, _) in managed {
        assert!(
            !text.contains(&format!("{k}=")),
            "{k} reached a direct agent terminal call:\n{text}"
        );
    }
}
