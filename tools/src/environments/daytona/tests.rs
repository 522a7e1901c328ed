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
