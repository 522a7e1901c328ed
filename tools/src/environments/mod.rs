//! Terminal backends: where `terminal` commands run (SPEC §9).
//!
//! Only the `local` backend exists so far; remote backends (docker, ssh, …) would implement the
//! same operations — run a command in the foreground with a timeout and an output cap, start a
//! background process, poll, write to and kill it.

pub mod local;

use std::collections::VecDeque;

/// Bounded output capture: the first `head_cap` bytes and the last `tail_cap` bytes, with a
/// count of everything seen, so a command that floods output costs fixed memory.
#[derive(Debug)]
pub struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    /// A capture keeping about 40% of `cap` from the start and 60% from the end (as execute_code
    /// does for stdout, SPEC §5).
    pub fn new(cap: usize) -> Self {
        let head_cap = cap * 2 / 5;
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            total: 0,
        }
    }

    /// Appends output.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.head_cap {
            let n = data.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
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

    /// Bytes seen in total.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether anything was dropped.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept output as text (invalid UTF-8 replaced), with a marker where bytes were dropped.
    pub fn render(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        let kept = (self.head.len() + self.tail.len()) as u64;
        if self.total > kept {
            out.push_str(&format!(
                "\n\n[... output truncated: {} bytes omitted out of {} ...]\n\n",
                self.total - kept,
                self.total
            ));
        }
        let (a, b) = self.tail.as_slices();
        let mut tail = Vec::with_capacity(a.len() + b.len());
        tail.extend_from_slice(a);
        tail.extend_from_slice(b);
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::HeadTail;

    #[test]
    fn keeps_head_and_tail_of_a_flood() {
        let mut c = HeadTail::new(100);
        for i in 0..1000u32 {
            c.push(format!("{i:05}\n").as_bytes());
        }
        let text = c.render();
        assert!(c.truncated());
        assert!(text.starts_with("00000\n"));
        assert!(text.ends_with("00999\n"));
        assert!(text.contains("omitted out of 6000"));
        let mut small = HeadTail::new(100);
        small.push(b"hello");
        assert_eq!(small.render(), "hello");
        assert!(!small.truncated());
    }
}
