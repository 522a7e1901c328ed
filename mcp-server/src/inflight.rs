//! The request ids each connection has in flight, so that a request reusing one is refused.
//!
//! The SDK keys a running request by its id alone: a second request with the id of one still
//! running replaced the first's entry, and the first's response, when it came, found no entry
//! and was dropped (the client waited forever for it). JSON-RPC leaves ids to the client but
//! requires them to be unique among its pending requests, so the front (the stdio transport,
//! the HTTP middleware) refuses such a request with `-32600` before the SDK sees it, and the
//! first goes on to its own response.
//!
//! An id is in flight from the moment the front passes the request on until both:
//! - the front is done with it: its response (or error) was written, its HTTP response stream
//!   ended, or the client cancelled it (the SDK then drops the response);
//! - for `tools/call`, the handler returned: a cancelled call may run on for a while (an
//!   interrupted script is given its kill grace), and its late, dropped response would
//!   otherwise be taken for the response of a new request under the same id.

use rmcp::model::RequestId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The connection a request came on: a stdio session, or an HTTP session by its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ConnKey {
    /// A stdio connection (`ExecServer::conn`).
    Conn(u64),
    /// An HTTP session (its `Mcp-Session-Id`).
    Session(String),
}

/// Who still holds an id.
#[derive(Debug)]
struct Hold {
    front: bool,
    handler: bool,
}

/// The ids in flight, per connection.
#[derive(Debug, Default)]
pub(crate) struct InFlight(Mutex<HashMap<(ConnKey, RequestId), Hold>>);

impl InFlight {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<(ConnKey, RequestId), Hold>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `id` in flight on `conn`; `false` (and nothing changes) if it already is.
    /// `handler`: the request is a `tools/call`, whose handler releases it too
    /// ([`InFlight::release_handler`]).
    pub(crate) fn begin(&self, conn: &ConnKey, id: &RequestId, handler: bool) -> bool {
        let mut table = self.table();
        let key = (conn.clone(), id.clone());
        if table.contains_key(&key) {
            return false;
        }
        table.insert(
            key,
            Hold {
                front: true,
                handler,
            },
        );
        true
    }

    /// The front is done with `id` (answered, stream ended, cancelled).
    pub(crate) fn release_front(&self, conn: &ConnKey, id: &RequestId) {
        self.release(conn, id, |h| h.front = false);
    }

    /// The `tools/call` handler of `id` returned.
    pub(crate) fn release_handler(&self, conn: &ConnKey, id: &RequestId) {
        self.release(conn, id, |h| h.handler = false);
    }

    /// Forgets `id`: the request never reached the handler (refused before it).
    pub(crate) fn forget(&self, conn: &ConnKey, id: &RequestId) {
        self.table().remove(&(conn.clone(), id.clone()));
    }

    fn release(&self, conn: &ConnKey, id: &RequestId, how: impl FnOnce(&mut Hold)) {
        let mut table = self.table();
        let key = (conn.clone(), id.clone());
        if let Some(hold) = table.get_mut(&key) {
            how(hold);
            if !hold.front && !hold.handler {
                table.remove(&key);
            }
        }
    }

    /// Whether `conn` has no request in flight: every response written.
    pub(crate) fn is_idle(&self, conn: &ConnKey) -> bool {
        !self.table().keys().any(|(c, _)| c == conn)
    }

    /// Whether no connection has a request in flight: every response written.
    pub(crate) fn is_empty(&self) -> bool {
        self.table().is_empty()
    }

    /// The `-32600` message for a request whose id is in flight.
    pub(crate) fn in_use_message(id: &RequestId) -> String {
        format!(
            "Invalid Request: id {id} is in use by a request still running; JSON-RPC ids must be \
             unique among a client's pending requests (the running one goes on and gets its own \
             response)"
        )
    }
}

/// Releases the handler's hold on its id when dropped (however the handler ends).
pub(crate) struct HandlerHold {
    pub(crate) table: Arc<InFlight>,
    pub(crate) conn: ConnKey,
    pub(crate) id: RequestId,
}

impl Drop for HandlerHold {
    fn drop(&mut self) {
        self.table.release_handler(&self.conn, &self.id);
    }
}

/// Releases the front's hold on its id when dropped (an HTTP response stream that ended).
pub(crate) struct FrontHold {
    pub(crate) table: Arc<InFlight>,
    pub(crate) conn: ConnKey,
    pub(crate) id: RequestId,
}

impl Drop for FrontHold {
    fn drop(&mut self) {
        self.table.release_front(&self.conn, &self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_free_again_once_front_and_handler_let_go() {
        let t = InFlight::default();
        let conn = ConnKey::Conn(1);
        let id = RequestId::Number(5);
        assert!(t.begin(&conn, &id, true));
        assert!(!t.begin(&conn, &id, false), "in use");
        assert!(
            t.begin(&ConnKey::Conn(2), &id, false),
            "another connection's ids are its own"
        );
        t.release_front(&conn, &id);
        assert!(!t.begin(&conn, &id, false), "the handler still runs");
        t.release_handler(&conn, &id);
        assert!(t.begin(&conn, &id, false));
        t.release_front(&conn, &id);
        assert!(t.begin(&conn, &id, false), "no handler to wait for");
        t.forget(&conn, &id);
        assert!(t.begin(&conn, &id, true));
    }
}
