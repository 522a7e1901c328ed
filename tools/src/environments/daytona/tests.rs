//! Unit tests of the daytona backend: the log-stream demultiplexer and the settings.
#![allow(clippy::unwrap_used)]

use super::*;

fn split(chunks: &[&[u8]]) -> (String, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    for c in chunks {
        tx.send(c.to_vec()).unwrap();
    }
    drop(tx);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    demux(rx, &mut out, &mut err);
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn the_log_stream_splits_at_markers_even_across_messages() {
    assert_eq!(
        split(&[b"\x01\x01\x01out1\x02\x02\x02err1\x01\x01", b"\x01out2"]),
        ("out1out2".into(), "err1".into())
    );
    assert_eq!(split(&[b"plain"]), ("plain".into(), String::new()));
    // A lone \x01 that is not a marker is data.
    assert_eq!(split(&[b"a\x01b"]), ("a\x01b".into(), String::new()));
}

#[test]
fn sizes_round_up_to_whole_gib() {
    assert_eq!(gib(Some(512)), Some(1));
    assert_eq!(gib(Some(4096)), Some(4));
    assert_eq!(gib(Some(5000)), Some(5));
    assert_eq!(gib(None), None);
}

/// A control plane at a throwaway port that answers every request with HTTP 200 and `body`,
/// counting the requests.
fn answering(body: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    answering_with("200 OK", body)
}

/// [`answering`] with another status line.
fn answering_with(
    status: &'static str,
    body: &'static str,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 65536];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, count)
}

fn inner_at(base: &str) -> Inner {
    Inner {
        api: Api::new(Credentials {
            api_url: base.to_string(),
            api_key: "k".into(),
        })
        .unwrap(),
        name: "vibeos-t".into(),
        task: "t".into(),
        persistent: false,
        image: None,
        cpu: None,
        memory_mb: None,
        disk_mb: None,
        python: "python3".into(),
        sandbox: Mutex::new(SandboxRef {
            id: String::new(),
            toolbox: String::new(),
        }),
        recreated: std::sync::atomic::AtomicBool::new(false),
        warm: Mutex::new(None),
        stopped: std::sync::atomic::AtomicBool::new(false),
    }
}

#[test]
fn a_sandbox_answer_that_is_not_a_sandbox_fails_the_start_at_once() {
    // A truncated body (and a well-formed one without a string id) used to be polled for the
    // whole start timeout, many requests a second, with no error.
    for body in [
        r#"{"id": 5, "state": "#,
        r#"{"id": 5, "state": "creating"}"#,
    ] {
        let (base, count) = answering(body);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(inner_at(&base).create().map(|s| s.id));
        });
        let outcome = rx.recv_timeout(Duration::from_secs(15));
        assert!(
            outcome.is_ok(),
            "the start did not end on a malformed answer"
        );
        let e = outcome.unwrap().unwrap_err().to_string();
        assert!(
            e.contains("not a sandbox") && e.contains("DAYTONA_API_URL"),
            "{e}"
        );
        assert!(
            e.contains(r#""id": 5"#) || e.contains(r#""id":5"#),
            "the answer is shown: {e}"
        );
        assert!(count.load(std::sync::atomic::Ordering::SeqCst) <= 3, "{e}");
    }
}

/// A refused creation names what to do about it: a quota or rate limit is no setting to fix,
/// and a server error is the service's (both told to check the image and sizes before).
#[test]
fn a_quota_or_a_server_error_is_not_blamed_on_the_settings() {
    for (status, words) in [
        ("429 Too Many Requests", "quota or rate limit"),
        ("503 Service Unavailable", "failed on its side"),
    ] {
        let (base, _) = answering_with(status, r#"{"message": "no"}"#);
        let e = inner_at(&base)
            .create()
            .map(|s| s.id)
            .unwrap_err()
            .to_string();
        assert!(e.contains(words), "{status}: {e}");
        assert!(!e.contains("daytona_image"), "{status}: {e}");
    }
}
