//! Bounded capture of an output stream: the first 40% and the last 60% of a limit.
//!
//! Used for a script's stdout/stderr (SPEC §5) and for `terminal` output alike: the reader
//! pushes chunks into a fixed head buffer and a ring for the tail, so memory stays flat however
//! much is written, and what falls between is only counted.

use std::collections::VecDeque;

/// Captured bytes of one stream.
#[derive(Debug, Clone)]
pub struct HeadTail {
    limit: usize,
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    /// A capture that keeps at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        let head_cap = limit * 2 / 5;
        HeadTail {
            limit,
            head_cap,
            tail_cap: limit - head_cap,
            head: Vec::with_capacity(head_cap.min(64 * 1024)),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Records a chunk.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return;
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    /// Total bytes written to the stream.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes seen but not kept.
    pub fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// Whether anything was dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.limit as u64
    }

    /// The kept text, with a marker where bytes were omitted. `what` names the stream.
    pub fn render(&self, what: &str) -> String {
        let head = String::from_utf8_lossy(trim_partial_tail(&self.head));
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend(self.tail.iter());
            return String::from_utf8_lossy(&all).into_owned();
        }
        let (a, b) = self.tail.as_slices();
        let tail: Vec<u8> = [a, b].concat();
        let tail = String::from_utf8_lossy(trim_partial_head(&tail));
        format!(
            "{head}\n\n... [{what} truncated: {} of {} bytes omitted] ...\n\n{tail}",
            self.omitted(),
            self.total
        )
    }
}

/// Drops an incomplete UTF-8 sequence at the end of a cut.
fn trim_partial_tail(b: &[u8]) -> &[u8] {
    let start = b.len().saturating_sub(3);
    for i in (start..b.len()).rev() {
        let byte = b[i];
        if byte & 0xC0 != 0x80 {
            let need = match byte {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            return if b.len() - i < need { &b[..i] } else { b };
        }
    }
    b
}

/// Drops UTF-8 continuation bytes at the start of a cut.
fn trim_partial_head(b: &[u8]) -> &[u8] {
    let skip = b.iter().take(3).take_while(|x| *x & 0xC0 == 0x80).count();
    &b[skip..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_everything_under_the_limit() {
        let mut c = HeadTail::new(100);
        c.push(b"hello ");
        c.push(b"world");
        assert!(!c.truncated());
        assert_eq!(c.render("output"), "hello world");
    }

    #[test]
    fn keeps_head_and_tail_and_counts_the_gap() {
        let mut c = HeadTail::new(10);
        for i in 0..100u8 {
            c.push(&[b'a' + (i % 26)]);
        }
        assert_eq!(c.total(), 100);
        assert_eq!(c.omitted(), 90);
        let out = c.render("output");
        assert!(out.starts_with("abcd\n"), "{out}");
        assert!(out.ends_with("qrstuv"), "{out}");
        assert!(out.contains("[output truncated: 90 of 100 bytes omitted]"));
    }

    #[test]
    fn a_single_huge_chunk_is_bounded() {
        let mut c = HeadTail::new(10);
        c.push(&vec![b'x'; 1_000_000]);
        assert_eq!(c.head.len() + c.tail.len(), 10);
        assert_eq!(c.omitted(), 999_990);
    }

    #[test]
    fn cuts_do_not_leave_broken_characters() {
        let mut c = HeadTail::new(10);
        c.push("ééééééééééééé".as_bytes());
        let out = c.render("output");
        assert!(!out.contains('\u{FFFD}'), "{out}");
    }
}
