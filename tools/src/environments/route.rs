//! One RPC socket for all executions of an environment, connections routed by token.
//!
//! Why: with ssh, a stream-local forward (`-R remote.sock:local.sock`) per execution costs a
//! round trip to set up and one to cancel (~12 ms of a ~20 ms no-op). The environment instead
//! forwards one socket once, and this router accepts its connections on the host: the stub
//! sends its execution's token as the first line (`VIBEOS_RPC_HELLO=1`), the router compares
//! it in constant time with the token of every execution registered, and hands the stream to
//! that execution's server ([`super::Connections::Routed`]). A connection whose first line is
//! no registered token gets an error reply and is closed. The requests on the stream still
//! carry the token and are checked again by the execution's server.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a new connection may take to send its token line.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest acceptable token line (a token is 64 hex digits).
const MAX_HELLO: usize = 256;

type Routes = Arc<Mutex<HashMap<u64, (String, Sender<UnixStream>)>>>;

/// The host end of an environment's shared RPC socket.
pub struct Router {
    routes: Routes,
    next: Mutex<u64>,
    path: PathBuf,
}

/// An execution's registration; dropping it unregisters the token.
pub struct Route {
    routes: Routes,
    id: u64,
}

impl Drop for Route {
    fn drop(&mut self) {
        if let Ok(mut r) = self.routes.lock() {
            r.remove(&self.id);
        }
    }
}

impl Router {
    /// Listens at `path` (in a private directory) and routes every connection on a thread.
    pub fn listen(path: &Path) -> std::io::Result<Router> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let shared = Arc::clone(&routes);
        std::thread::Builder::new()
            .name("vibeos-rpc-router".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let routes = Arc::clone(&shared);
                    // A thread each: a peer that never sends its line holds up nobody.
                    let spawned = std::thread::Builder::new()
                        .name("vibeos-rpc-hello".into())
                        .spawn(move || route(conn, &routes));
                    if let Err(e) = spawned {
                        tracing::warn!("backends: cannot route an RPC connection: {e}");
                    }
                }
            })?;
        Ok(Router {
            routes,
            next: Mutex::new(0),
            path: path.to_path_buf(),
        })
    }

    /// The socket's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Registers an execution's `token`: its connections arrive on the receiver until the
    /// [`Route`] is dropped.
    pub fn register(&self, token: &str) -> (Route, Receiver<UnixStream>) {
        let (tx, rx) = channel();
        let id = {
            let mut n = self.next.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        if let Ok(mut r) = self.routes.lock() {
            r.insert(id, (token.to_string(), tx));
        }
        (
            Route {
                routes: Arc::clone(&self.routes),
                id,
            },
            rx,
        )
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads the token line (byte by byte: nothing of the first request may be consumed) and
/// hands the stream on, or refuses it.
fn route(mut conn: UnixStream, routes: &Routes) {
    let _ = conn.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut line = Vec::with_capacity(72);
    let mut byte = [0u8; 1];
    let complete = loop {
        match conn.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break true,
            Ok(1) if line.len() < MAX_HELLO => line.push(byte[0]),
            _ => break false,
        }
    };
    let target = if complete {
        let routes = routes.lock().unwrap_or_else(|p| p.into_inner());
        // Every registered token is compared, each in constant time.
        routes
            .values()
            .filter(|(token, _)| super::agent::token_matches(&line, token.as_bytes()))
            .map(|(_, tx)| tx.clone())
            .last()
    } else {
        None
    };
    match target {
        Some(tx) => {
            let _ = conn.set_read_timeout(None);
            if let Err(e) = tx.send(conn) {
                refuse(e.0, "the execution this token belongs to has ended");
            }
        }
        None => refuse(
            conn,
            "connection refused: the first line is not the token of a running execution",
        ),
    }
}

fn refuse(mut conn: UnixStream, message: &str) {
    let reply = serde_json::json!({
        "id": null,
        "error": {"code": "unauthorized", "message": message},
    });
    let _ = conn.write_all(format!("{reply}\n").as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn connections_reach_the_execution_of_their_token_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let router = Router::listen(&dir.path().join("rpc.sock")).unwrap();
        let (a, rx_a) = router.register(&"a".repeat(64));
        let (_b, rx_b) = router.register(&"b".repeat(64));

        // The hello line is consumed; the request after it arrives intact.
        let mut c = UnixStream::connect(router.path()).unwrap();
        c.write_all(format!("{}\n{{\"id\":1}}\n", "b".repeat(64)).as_bytes())
            .unwrap();
        let got = rx_b.recv_timeout(Duration::from_secs(5)).unwrap();
        let mut first = String::new();
        BufReader::new(got).read_line(&mut first).unwrap();
        assert_eq!(first, "{\"id\":1}\n");
        assert!(rx_a.try_recv().is_err());

        // An unknown token gets an error reply, and so does a token once unregistered.
        let refused = |token: &str| {
            let mut c = UnixStream::connect(router.path()).unwrap();
            c.write_all(format!("{token}\n").as_bytes()).unwrap();
            let mut reply = String::new();
            BufReader::new(c).read_line(&mut reply).unwrap();
            reply
        };
        assert!(refused(&"c".repeat(64)).contains("unauthorized"));
        drop(a);
        assert!(refused(&"a".repeat(64)).contains("unauthorized"));
        assert!(rx_a.try_recv().is_err());

        // A line that never ends is cut at its limit.
        let mut c = UnixStream::connect(router.path()).unwrap();
        c.write_all(&[b'x'; 1024]).unwrap();
        let mut reply = String::new();
        BufReader::new(c).read_line(&mut reply).unwrap();
        assert!(reply.contains("unauthorized"), "{reply}");
    }
}
