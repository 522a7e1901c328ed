//! How a daytona command's bytes travel: its combined log stream, followed over the toolbox's
//! websocket and split into stdout and stderr at the service's markers, and its stdin, sent as
//! "send input" calls, and its completion ([`DaytonaProcess`]). Kept apart from the sandbox lifecycle in the parent module.

use super::{err, message, Inner, REQUEST_TIMEOUT};
use crate::environments::process::group_kill;
use crate::environments::random_hex;
use crate::environments::{EnvError, GroupSignal, Process};
use futures_util::StreamExt as _;
use serde_json::json;
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Follows a session command's log websocket, sending each message's bytes to `chunks`.
pub(super) async fn stream_logs(
    http: &reqwest::Client,
    key: &str,
    url: &str,
    chunks: &std::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), String> {
    use base64::Engine as _;
    use tokio_tungstenite::tungstenite::{protocol::Role, Message};
    let nonce: [u8; 16] = std::array::from_fn(|i| {
        u8::from_str_radix(&random_hex(16)[i * 2..i * 2 + 2], 16).unwrap_or(0)
    });
    let resp = http
        .get(url)
        .bearer_auth(key)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header(
            "Sec-WebSocket-Key",
            base64::engine::general_purpose::STANDARD.encode(nonce),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status().as_u16() != 101 {
        return Err(format!("HTTP {} instead of a websocket", resp.status()));
    }
    let upgraded = resp.upgrade().await.map_err(|e| e.to_string())?;
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    while let Some(msg) = ws.next().await {
        match msg.map_err(|e| e.to_string())? {
            Message::Binary(b) => {
                let _ = chunks.send(b.to_vec());
            }
            Message::Text(t) => {
                let _ = chunks.send(t.as_bytes().to_vec());
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

const OUT_MARK: &[u8] = b"\x01\x01\x01";
const ERR_MARK: &[u8] = b"\x02\x02\x02";

/// Splits the toolbox's combined log stream into stdout and stderr at its markers (which may
/// straddle messages).
pub(super) fn demux(
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    mut out: impl std::io::Write,
    mut err: impl std::io::Write,
) {
    let mut to_err = false;
    let mut carry: Vec<u8> = Vec::new();
    while let Ok(chunk) = chunks.recv() {
        carry.extend_from_slice(&chunk);
        let mut start = 0;
        let mut i = 0;
        let mut emit = |to_err: bool, bytes: &[u8]| {
            if !bytes.is_empty() {
                let _ = if to_err {
                    err.write_all(bytes)
                } else {
                    out.write_all(bytes)
                };
            }
        };
        while i < carry.len() {
            if carry[i] == 1 || carry[i] == 2 {
                let rest = &carry[i..];
                let mark = if carry[i] == 1 { OUT_MARK } else { ERR_MARK };
                if rest.len() < mark.len() && mark.starts_with(rest) {
                    break; // maybe a marker cut by the message boundary
                }
                if rest.starts_with(mark) {
                    emit(to_err, &carry[start..i]);
                    to_err = carry[i] == 2;
                    i += mark.len();
                    start = i;
                    continue;
                }
            }
            i += 1;
        }
        emit(to_err, &carry[start..i]);
        carry.drain(..i);
    }
    if !carry.is_empty() {
        let _ = if to_err {
            err.write_all(&carry)
        } else {
            out.write_all(&carry)
        };
    }
}

/// A session command's stdin: each complete line (or flush) is one "send input" call. The
/// toolbox has no way to close a command's stdin, so dropping this sends what is left and
/// nothing more; commands are ended by [`Process::kill`].
pub(super) struct Input {
    pub(super) inner: Arc<Inner>,
    pub(super) url: String,
    pub(super) pending: Vec<u8>,
}

impl Input {
    fn send(&mut self, upto: usize) -> std::io::Result<()> {
        if upto == 0 {
            return Ok(());
        }
        let data: Vec<u8> = self.pending.drain(..upto).collect();
        let text = String::from_utf8_lossy(&data).into_owned();
        let (status, v) = self
            .inner
            .api
            .request(
                reqwest::Method::POST,
                self.url.clone(),
                Some(json!({ "data": text })),
                REQUEST_TIMEOUT,
            )
            .map_err(std::io::Error::other)?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                format!(
                    "daytona: sending input failed (HTTP {status}): {}",
                    message(&v)
                ),
            ))
        }
    }
}

impl std::io::Write for Input {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if let Some(last) = self.pending.iter().rposition(|b| *b == b'\n') {
            self.send(last + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let n = self.pending.len();
        self.send(n)
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

pub(super) struct DaytonaProcess {
    pub(super) inner: Arc<Inner>,
    pub(super) pgid_file: String,
    pub(super) done: Mutex<Option<Result<i32, String>>>,
    pub(super) changed: Condvar,
}

impl DaytonaProcess {
    pub(super) fn finish(&self, outcome: Result<i32, String>) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.changed.notify_all();
    }

    fn outcome(done: &Option<Result<i32, String>>) -> Option<Result<i32, EnvError>> {
        done.as_ref()
            .map(|r| r.clone().map_err(|m| err("waiting for a command", m)))
    }
}

impl Process for DaytonaProcess {
    fn wait(&self) -> Result<i32, EnvError> {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = Self::outcome(&done) {
                return r;
            }
            done = self.changed.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn try_wait(&self) -> Result<Option<i32>, EnvError> {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        Self::outcome(&done).transpose()
    }

    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError> {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return Ok(());
        }
        self.inner
            .execute(
                &group_kill(&self.pgid_file, signal),
                Duration::from_secs(15),
            )
            .map(|_| ())
    }
}
