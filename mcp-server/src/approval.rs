//! Dangerous-command approval for `vibeos-exec serve` (SPEC §8): the MCP client is asked
//! through elicitation, when it supports it.
//!
//! Approvals are asked from deep inside a call — a script's `terminal` call, over the RPC
//! channel, on a tool thread — far from the MCP request that started it. The link is the task
//! id: every call of a connection carries `mcp-conn-<n>`, and while a call runs its task id
//! maps to the client's peer here. The process-wide approval callback looks the peer up and
//! sends a form elicitation (once / session / always / deny). A client that did not declare
//! elicitation support cannot be asked: the reachability check says so, the command is denied
//! with a message naming the reason, and scripts are not held up by the whole-script guard
//! (headless policy). "session" approvals then last as long as the client's connection.

use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientResult, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ServerNotification, ServerRequest,
};
use rmcp::service::{ElicitationMode, PeerRequestOptions, RoleServer, ServiceError};
use rmcp::Peer;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use vibeos_tools::approval::{self, ApprovalAnswer, ApprovalChoice, ApprovalRequest, NoAnswer};

struct Bound {
    peer: Peer<RoleServer>,
    handle: tokio::runtime::Handle,
    calls: usize,
}

fn peers() -> MutexGuard<'static, HashMap<String, Bound>> {
    static PEERS: OnceLock<Mutex<HashMap<String, Bound>>> = OnceLock::new();
    PEERS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The task id of every call of connection `conn`.
pub fn task_id(conn: u64) -> String {
    format!("mcp-conn-{conn}")
}

/// Keeps a task id mapped to its client while a call runs.
#[derive(Debug)]
pub struct Binding {
    task_id: String,
}

/// Maps `task_id` to `peer` until the returned binding is dropped (calls nest: counted).
pub fn bind(task_id: &str, peer: Peer<RoleServer>) -> Binding {
    let handle = tokio::runtime::Handle::current();
    let mut map = peers();
    let entry = map.entry(task_id.to_string()).or_insert(Bound {
        peer: peer.clone(),
        handle: handle.clone(),
        calls: 0,
    });
    entry.peer = peer;
    entry.handle = handle;
    entry.calls += 1;
    Binding {
        task_id: task_id.to_string(),
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let mut map = peers();
        if let Some(b) = map.get_mut(&self.task_id) {
            b.calls -= 1;
            if b.calls == 0 {
                map.remove(&self.task_id);
            }
        }
    }
}

fn reachable(task_id: Option<&str>) -> Result<(), String> {
    let map = peers();
    let Some(bound) = task_id.and_then(|t| map.get(t)) else {
        return Err("the call did not come from a connected MCP client".into());
    };
    if bound
        .peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        Ok(())
    } else {
        Err(
            "the MCP client does not support elicitation, so it cannot be asked; add the \
             command to command_allowlist, use a client with elicitation support, or set \
             approvals.mode"
                .into(),
        )
    }
}

/// Asks the client of `req`'s connection. Only the client's "deny" or "decline" is the user's
/// denial; a cancel, an error, a timeout or a missing decision is a [`NoAnswer`] naming it.
fn ask(req: &ApprovalRequest) -> ApprovalAnswer {
    let Some((peer, handle)) = req
        .task_id
        .as_deref()
        .and_then(|t| peers().get(t).map(|b| (b.peer.clone(), b.handle.clone())))
    else {
        return Err(NoAnswer::ClientError(
            "the MCP client of this call is no longer connected".into(),
        ));
    };
    let what = if req.is_script {
        "run this execute_code script"
    } else {
        "run this command"
    };
    let matches: Vec<String> = req.matches.iter().map(|(_, d)| d.clone()).collect();
    let message = format!(
        "vibeos-exec asks to {what}, which matches: {}.\n\n{}",
        approval::shown_to_a_person(&matches.join("; ")),
        approval::shown_to_a_person(&req.command)
    );
    let params = serde_json::from_value::<ElicitRequestParams>(json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "decision": {
                    "type": "string",
                    "title": "Decision",
                    "description": "once: this time; session: these patterns for this connection; always: add them to command_allowlist; deny: do not run it",
                    "enum": ["once", "session", "always", "deny"]
                }
            },
            "required": ["decision"]
        }
    }));
    let params = match params {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot build the approval elicitation: {e}");
            return Err(NoAnswer::CallbackFailed(format!(
                "cannot build the elicitation request: {e}"
            )));
        }
    };
    let timeout = vibeos_tools::approval_policy::settings().timeout;
    // A tool thread, not a runtime worker: block on the request on the connection's runtime.
    let answer = handle.block_on(elicit(&peer, params, timeout, req.execution_ended.clone()));
    match answer {
        Ok(result) => match result.action {
            ElicitationAction::Accept => {
                match result.content.as_ref().and_then(|c| c.get("decision")) {
                    None => Err(NoAnswer::ClientError(
                        "the client accepted the form without a decision".into(),
                    )),
                    Some(decision) => decision
                        .as_str()
                        .and_then(approval::parse_offered_choice)
                        .ok_or_else(|| NoAnswer::NotAChoice(decision.to_string())),
                }
            }
            // The person declined the form: their denial.
            ElicitationAction::Decline => Ok(ApprovalChoice::Deny),
            ElicitationAction::Cancel => Err(NoAnswer::Cancelled(
                "the MCP client dismissed the request".into(),
            )),
            // An action added to the protocol later: not an answer this server understands.
            other => Err(NoAnswer::ClientError(format!(
                "the client answered with the unknown action {other:?}"
            ))),
        },
        Err(ServiceError::Timeout { timeout }) => Err(NoAnswer::TimedOut(timeout)),
        Err(ServiceError::Cancelled { reason }) => {
            Err(NoAnswer::Cancelled(reason.unwrap_or_default()))
        }
        Err(e) => {
            tracing::warn!("the MCP client did not answer the approval request: {e}");
            Err(NoAnswer::ClientError(e.to_string()))
        }
    }
}

/// Sends the form and waits for the client's answer, `timeout` at most. When the execution
/// that asked ends first (the client cancelled its call, its timeout), the question is
/// withdrawn with a `notifications/cancelled` for it: the client's prompt would otherwise stay
/// open for an answer nothing waits for any more.
async fn elicit(
    peer: &Peer<RoleServer>,
    params: ElicitRequestParams,
    timeout: std::time::Duration,
    mut ended: vibeos_tools::EndedFlag,
) -> Result<ElicitResult, ServiceError> {
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(timeout);
    let request = peer
        .send_cancellable_request(
            ServerRequest::ElicitRequest(ElicitRequest::new(params)),
            options,
        )
        .await?;
    let id = request.id.clone();
    tokio::select! {
        answer = request.await_response() => match answer? {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(ServiceError::UnexpectedResponse),
        },
        () = ended.ended() => {
            let reason = "the execution that asked ended".to_string();
            let withdrawn = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some(reason.clone()),
            ));
            if let Err(e) = peer
                .send_notification(ServerNotification::CancelledNotification(withdrawn))
                .await
            {
                tracing::debug!("cannot withdraw the approval request: {e}");
            }
            Err(ServiceError::Cancelled { reason: Some(reason) })
        }
    }
}

/// Installs the elicitation-backed approval callback and its reachability check for this
/// process (`vibeos-exec serve`).
pub fn install() {
    approval::set_approval_host(Some(Arc::new(ask)));
    approval::set_host_reachability(Some(Arc::new(reachable)));
}
