//! Draining a child's output pipe into a bounded [`HeadTail`] capture.
//!
//! The reader drains continuously, so the child never blocks on a full pipe.

use tokio::io::{AsyncRead, AsyncReadExt};
pub use vibeos_tools::capture::HeadTail;

/// A task draining `stream` (when the child has one) into a capture of `limit` bytes; a missing
/// stream gives an empty capture. Every supervision (local and remote) reads stdout and stderr
/// this way.
pub fn spawn_drain<R: AsyncRead + Unpin + Send + 'static>(
    stream: Option<R>,
    limit: usize,
) -> tokio::task::JoinHandle<HeadTail> {
    tokio::spawn(async move {
        match stream {
            Some(s) => drain(s, limit).await,
            None => HeadTail::new(limit),
        }
    })
}

/// Reads `stream` to its end into a capture of `limit` bytes.
pub async fn drain<R: AsyncRead + Unpin>(mut stream: R, limit: usize) -> HeadTail {
    let mut cap = HeadTail::new(limit);
    // Read into the buffer's spare capacity: a zeroed 64 KiB buffer per stream cost a cold run
    // 16 page faults each for a script that prints nothing (docs/cold-start.md, "Stop 45").
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut printed = false;
    loop {
        buf.clear();
        match stream.read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if !printed {
                    // Output will be redacted at the end: compile the patterns meanwhile.
                    printed = true;
                    vibeos_tools::redact::prepare_in_background();
                }
                cap.push(&buf[..n])
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    cap
}
