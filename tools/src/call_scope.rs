//! The tool calls of an execution, abandoned when the execution ends.
//!
//! A script's call of an async tool (an MCP tool, say) runs on the async bridge while a thread
//! of the host's blocking pool waits for it. When the execution ends first (its timeout, an
//! interrupt), nothing would wait for that call any more, yet it would run on to its own
//! timeout (60 s for an MCP call), and a one-shot host could not exit before then: its runtime
//! waits for the blocking thread at shutdown. So the supervisor calls [`cancel_scope`] when an
//! execution ends, as it kills the terminal commands of the execution
//! ([`crate::environments::local::kill_scope`]): every async call of that execution still
//! running ends at once with a `CallAbandoned` error, and one that would start later is refused.
//!
//! The scope of a call is its execution's environment `Arc` (one per execution, as
//! `local::scope_of` uses it). Each entry here holds a `Weak` of it: that keeps the address from
//! being reused by a later execution while the entry exists (a `Weak` keeps the allocation), and
//! an entry whose execution is gone (no strong reference left) is dropped on the next use. Agent
//! calls (no environment) have no scope and are never cancelled here.
//!
//! Sync calls see the same flag: the dispatch refuses a script's call whose execution has
//! ended (one queued behind others, or one that waited for an approval), `terminal` starts no
//! command for it, and a long search stops.

use crate::{BoxFuture, ToolContext, ToolError};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::watch;

type Env = Vec<(String, String)>;

/// One execution's async calls: set to `true` when the execution ended.
struct Scope {
    env: Weak<Env>,
    ended: watch::Sender<bool>,
    /// How many executions this one runs inside ([`mark_nesting`]).
    nesting: u32,
}

static SCOPES: Mutex<Vec<Scope>> = Mutex::new(Vec::new());

fn scopes() -> MutexGuard<'static, Vec<Scope>> {
    SCOPES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The flag of `env`'s execution, created on first use; entries of executions that are gone
/// are dropped on the way.
fn flag_of<'a>(list: &'a mut Vec<Scope>, env: &Arc<Env>) -> &'a watch::Sender<bool> {
    list.retain(|s| s.env.strong_count() > 0);
    let at = match list
        .iter()
        .position(|s| std::ptr::eq(s.env.as_ptr(), Arc::as_ptr(env)))
    {
        Some(at) => at,
        None => {
            list.push(Scope {
                env: Arc::downgrade(env),
                ended: watch::channel(false).0,
                nesting: 0,
            });
            list.len() - 1
        }
    };
    &list[at].ended
}

/// Ends every async tool call of the execution `ctx` belongs to that is still running (it
/// returns a `CallAbandoned` error at once), and refuses those that would start later. Does
/// nothing for a context without an execution environment (an agent call).
pub fn cancel_scope(ctx: &ToolContext) {
    let Some(env) = &ctx.env else {
        return;
    };
    let mut list = scopes();
    flag_of(&mut list, env).send_replace(true);
}

/// Records that the execution whose script calls run in `ctx` was started by a tool call of
/// another execution's script, `nesting` levels down (a host tool that runs code for a script:
/// the Python package's `execute_code` inside a tool handler). A host asks it back with
/// [`nesting`] when such a call starts yet another execution, to bound how deep that goes.
/// Nothing for an agent context.
pub fn mark_nesting(ctx: &ToolContext, nesting: u32) {
    let Some(env) = &ctx.env else {
        return;
    };
    let mut list = scopes();
    flag_of(&mut list, env);
    if let Some(scope) = list
        .iter_mut()
        .find(|s| std::ptr::eq(s.env.as_ptr(), Arc::as_ptr(env)))
    {
        scope.nesting = nesting;
    }
}

/// How many executions the execution of `ctx` runs inside ([`mark_nesting`]); 0 for a
/// top-level one and for an agent call.
pub fn nesting(ctx: &ToolContext) -> u32 {
    let Some(env) = &ctx.env else {
        return 0;
    };
    scopes()
        .iter()
        .find(|s| std::ptr::eq(s.env.as_ptr(), Arc::as_ptr(env)) && s.env.strong_count() > 0)
        .map_or(0, |s| s.nesting)
}

/// Whether the execution `ctx` belongs to has ended ([`cancel_scope`]). Always `false` for an
/// agent call. Sync tools ask it before they start and, when they run long (a search of a
/// large tree), as they go: a call the script can no longer receive must not keep a core busy
/// for the executions after it.
pub fn scope_ended(ctx: &ToolContext) -> bool {
    // The address `local::scope_of` gives; not called from here, since `environments` depends
    // on this module.
    ctx.env
        .as_ref()
        .is_some_and(|env| ended_at(Arc::as_ptr(env) as *const () as usize))
}

/// [`scope_ended`] for the scope `local::scope_of` gives (the address of the execution's
/// environment), for code that holds that address but not the context. Only meaningful while
/// the caller keeps that environment alive (it does: the call's context holds it), so the
/// address cannot belong to a later execution.
pub(crate) fn ended_at(scope: usize) -> bool {
    scopes().iter().any(|s| {
        s.env.as_ptr() as *const () as usize == scope
            && s.env.strong_count() > 0
            && *s.ended.borrow()
    })
}

/// A cheap handle on [`scope_ended`] for a loop that asks often (no lock per question).
pub fn ended_flag(ctx: &ToolContext) -> EndedFlag {
    EndedFlag(ctx.env.as_ref().map(|env| {
        let mut list = scopes();
        flag_of(&mut list, env).subscribe()
    }))
}

/// See [`ended_flag`]. The flag of an agent call (no execution) is never set.
#[derive(Debug, Clone, Default)]
pub struct EndedFlag(Option<watch::Receiver<bool>>);

impl EndedFlag {
    /// Whether the call's execution has ended.
    pub fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Resolves when the call's execution ends; never for an agent call (or when the flag's
    /// execution is gone without having ended, which cannot happen while a call of it waits).
    pub async fn ended(&mut self) {
        match self.0.as_mut() {
            Some(rx) => {
                if rx.wait_for(|ended| *ended).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// The error of a sync call whose execution ended before or while it ran.
pub(crate) fn abandoned(tool: &str) -> ToolError {
    ToolError::new(
        crate::ToolErrorKind::CallAbandoned,
        format!(
            "the execution ended before `{tool}` answered, so the call was abandoned \
             (it may have partly run)"
        ),
    )
}

/// `fut`, the handler of `tool` called in `ctx`, ended with a `CallAbandoned` error as soon as
/// its execution ends ([`cancel_scope`]). Unchanged for agent calls.
pub(crate) fn scoped<T: Send + 'static>(
    ctx: &ToolContext,
    tool: &str,
    fut: BoxFuture<Result<T, ToolError>>,
) -> BoxFuture<Result<T, ToolError>> {
    let Some(env) = &ctx.env else {
        return fut;
    };
    let mut ended = flag_of(&mut scopes(), env).subscribe();
    // Held by the call, so its scope (and the entry's address) outlives it.
    let keep = Arc::clone(env);
    let tool = tool.to_string();
    Box::pin(async move {
        let _keep = keep;
        let ended_now = async {
            // The sender lives while the scope does, which this call keeps alive; were it gone
            // anyway, the call just runs to its own end.
            if ended.wait_for(|ended| *ended).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            () = ended_now => Err(abandoned(&tool)),
            result = fut => result,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_ctx() -> ToolContext {
        let mut ctx = ToolContext::agent("/");
        ctx.env = Some(Arc::new(vec![("A".into(), "b".into())]));
        ctx
    }

    fn block<T>(fut: BoxFuture<T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(fut)
    }

    #[test]
    fn a_call_ends_when_its_execution_does_and_later_ones_are_refused() {
        let ctx = script_ctx();
        let other = script_ctx();
        let hung: BoxFuture<Result<(), ToolError>> = Box::pin(std::future::pending());
        let call = scoped(&ctx, "slow", hung);
        let canceller = ctx.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            cancel_scope(&canceller);
        });
        let e = block(call).err().unwrap_or_else(|| panic!("not abandoned"));
        assert_eq!(e.kind, crate::ToolErrorKind::CallAbandoned);
        assert!(e.message.contains("`slow`"), "{e}");
        // A call of the ended execution is refused; another execution's call runs.
        let late = scoped(&ctx, "late", Box::pin(async { Ok(1) }));
        assert!(block(late).is_err());
        let fine = scoped(&other, "fine", Box::pin(async { Ok(2) }));
        assert_eq!(block(fine).ok(), Some(2));
        // Agent calls are never cancelled.
        let agent = ToolContext::agent("/");
        cancel_scope(&agent);
        assert_eq!(
            block(scoped(&agent, "a", Box::pin(async { Ok(3) }))).ok(),
            Some(3)
        );
    }
}
