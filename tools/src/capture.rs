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
    /// The first byte that did not fit in the head and the last byte that left the tail: the
    /// two neighbours of the gap, which tell whether a cut split a word.
    after_head: Option<u8>,
    before_tail: Option<u8>,
    /// How far the word and the token the head's cut split go on past the cut (up to
    /// [`RUN_CAP`]): what the head keeps of them is only part of their length.
    after_head_runs: Runs,
    /// How far the word and the token the tail's cut split reach back before the cut.
    before_tail_runs: Runs,
}

/// Lengths of the run of non-whitespace (`word`) and of [`token_byte`]s (`token`) on the far
/// side of a cut, counted up to [`RUN_CAP`]; `open` while the runs after the head's cut may
/// still grow.
#[derive(Debug, Clone, Copy, Default)]
struct Runs {
    word: usize,
    token: usize,
    word_open: bool,
    token_open: bool,
}

/// Past this length a run is longer than anything a cut drops: counting further is moot.
const RUN_CAP: usize = MAX_CUT_WORD + 1;

impl Runs {
    /// Runs that start right after a cut, still open.
    fn opening() -> Self {
        Runs {
            word_open: true,
            token_open: true,
            ..Runs::default()
        }
    }

    /// Goes on counting the runs after a cut over the next bytes of the stream.
    fn extend(&mut self, bytes: &[u8]) {
        fn grow(run: &mut usize, open: &mut bool, bytes: &[u8], part: fn(u8) -> bool) {
            if !*open {
                return;
            }
            let n = bytes
                .iter()
                .take(RUN_CAP - *run)
                .take_while(|c| part(**c))
                .count();
            *run += n;
            *open = n == bytes.len() && *run < RUN_CAP;
        }
        grow(&mut self.word, &mut self.word_open, bytes, not_space);
        grow(&mut self.token, &mut self.token_open, bytes, token_byte);
    }

    /// The runs that end at the end of `bytes`, which came right after what was counted.
    fn end_after(&mut self, bytes: &[u8]) {
        fn ending(run: usize, bytes: &[u8], part: fn(u8) -> bool) -> usize {
            match bytes.iter().rposition(|c| !part(*c)) {
                Some(i) => (bytes.len() - i - 1).min(RUN_CAP),
                None => (run + bytes.len()).min(RUN_CAP),
            }
        }
        self.word = ending(self.word, bytes, not_space);
        self.token = ending(self.token, bytes, token_byte);
    }
}

fn not_space(c: u8) -> bool {
    !c.is_ascii_whitespace()
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
            after_head: None,
            before_tail: None,
            after_head_runs: Runs::opening(),
            before_tail_runs: Runs::default(),
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
        if data.is_empty() {
            return;
        }
        if self.after_head.is_none() {
            self.after_head = Some(data[0]);
        }
        self.after_head_runs.extend(data);
        // What leaves the tail's window: its oldest `from_tail` bytes, then the first
        // `from_data` of the chunk (all of it when the tail keeps nothing). The byte just
        // before the window and the runs that end there are measured on what leaves.
        let leaving = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        let from_tail = leaving.min(self.tail.len());
        let from_data = leaving - from_tail;
        if leaving > 0 {
            let (a, b) = self.tail.as_slices();
            let from_a = from_tail.min(a.len());
            let gone = [&a[..from_a], &b[..from_tail - from_a], &data[..from_data]];
            for part in gone {
                self.before_tail_runs.end_after(part);
            }
            if let Some(last) = gone.iter().rev().find_map(|part| part.last()) {
                self.before_tail = Some(*last);
            }
        }
        self.tail.drain(..from_tail);
        self.tail.extend(&data[from_data..]);
    }

    /// Total bytes written to the stream.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes seen but not shown: the gap between head and tail, plus what [`HeadTail::render`]
    /// trims at the two cuts.
    pub fn omitted(&self) -> u64 {
        if !self.truncated() {
            return self.total - (self.head.len() + self.tail.len()) as u64;
        }
        let (head, tail) = self.kept();
        self.total - (head.len() + tail.len()) as u64
    }

    /// Head and tail of a truncated stream as shown. A cut can split a character, and it can
    /// split a secret: the redaction that runs on the rendered text then sees neither half as
    /// a secret (`sk-Q9x7…` cut after 32 of its 33 characters showed the 32). So each cut also
    /// drops the word it split (see [`cut_word_len`]) and a private key block it cut open.
    ///
    /// With `security.redact_output` off nothing redacts what is kept, and a split word hides
    /// nothing: all of the head and the tail stay (only a split character is trimmed). A small
    /// cap of one long line showed nothing at all.
    fn kept(&self) -> (&[u8], Vec<u8>) {
        let (a, b) = self.tail.as_slices();
        let tail: Vec<u8> = [a, b].concat();
        if !crate::settings::redact_output() {
            return (
                trim_partial_tail(&self.head),
                trim_partial_head(&tail).to_vec(),
            );
        }
        let head = trim_cut_word_at_end(
            open_key_block_cut_off(&self.head),
            self.after_head,
            self.after_head_runs,
        );
        let tail = trim_cut_word_at_start(
            key_block_end_cut_off(&tail),
            self.before_tail,
            self.before_tail_runs,
        )
        .to_vec();
        (head, tail)
    }

    /// Whether anything was dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.limit as u64
    }

    /// The kept text, with a marker where bytes were omitted. `what` names the stream.
    pub fn render(&self, what: &str) -> String {
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend(self.tail.iter());
            return String::from_utf8_lossy(&all).into_owned();
        }
        let (head, tail) = self.kept();
        let head = String::from_utf8_lossy(head);
        let tail = String::from_utf8_lossy(&tail);
        format!(
            "{head}\n\n... [{what} truncated: {} of {} bytes omitted] ...\n\n{tail}",
            self.omitted(),
            self.total
        )
    }
}

/// The marker [`HeadTail::render`] puts where it cut, as a pattern: redaction looks for what
/// a cut left of a secret value on either side of it.
pub(crate) static CUT_MARKER: std::sync::LazyLock<Option<regex::Regex>> =
    std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"\n\n\.\.\. \[[^\]\n]{1,64} truncated: [0-9]+ of [0-9]+ bytes omitted\] \.\.\.\n\n",
        )
        .ok()
    });

/// The longest word a cut drops (see [`cut_word_len`]): longer than any credential format
/// the redaction knows, short enough that output of one endless line loses little more.
pub const MAX_CUT_WORD: usize = 4096;

/// Whether `c` can be part of a credential token of a format the redaction knows: letters,
/// digits and the punctuation of base64, URLs and key formats. `:` and `@` are included
/// because a Telegram bot token (`123456789:AA…`) and a URL's `user:password@` hold them: a cut
/// that left `:AA…` or `:password@host` would show a secret no pattern recognises any more.
/// Quotes, commas, brackets, braces, `;`, `<`, `>` and whitespace end a token.
fn token_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-_.~+/=:@%".contains(&c)
}

/// How many bytes next to a cut it drops: `near` are the bytes on the kept side, nearest to
/// the cut first, `across` the byte on the other side of the cut (`None`: nothing was cut
/// there) and `far` how long the runs that byte starts are. What a cut splits is dropped
/// whole, so redaction never sees a piece of a secret:
/// - the whole word (the run of non-whitespace) when, both sides counted, it is at most
///   [`MAX_CUT_WORD`] bytes: an environment secret can hold any character but whitespace;
/// - in a longer word (minified JSON, one endless line), the credential-shaped token the cut
///   split (a run of [`token_byte`]s), when it is at most [`MAX_CUT_WORD`] bytes. Backing
///   off a fixed 4 KiB instead made a new cut there, which showed 26 of a token's 36
///   characters when that point fell inside `"token":"ghp_…"`.
///
/// A run of token characters longer than that is no credential format: it stays, so a cap of
/// one endless line keeps its 40 % and 60 % (a 1,000-byte cap of `'A' * 100_000` used to show
/// nothing, since only the kept side was measured).
fn cut_word_len<'a>(
    near: impl Iterator<Item = &'a u8> + Clone,
    across: Option<u8>,
    far: Runs,
) -> usize {
    let Some(across) = across else {
        return 0;
    };
    if across.is_ascii_whitespace() {
        return 0;
    }
    let word = near
        .clone()
        .take(RUN_CAP)
        .take_while(|c| not_space(**c))
        .count();
    if word + far.word <= MAX_CUT_WORD {
        return word;
    }
    if !token_byte(across) {
        // The cut fell between a token and a delimiter: it split no token.
        return 0;
    }
    let token = near.take(RUN_CAP).take_while(|c| token_byte(**c)).count();
    if token + far.token <= MAX_CUT_WORD {
        token
    } else {
        0
    }
}

/// The head without the word the cut split, if it split one (and without a broken character).
/// `after` is the first byte that did not fit in the head.
fn trim_cut_word_at_end(b: &[u8], after: Option<u8>, far: Runs) -> &[u8] {
    let run = cut_word_len(b.iter().rev(), after, far);
    trim_partial_tail(&b[..b.len() - run])
}

/// The tail without the word the cut split, if it split one (and without a broken character).
/// `before` is the last byte that left the tail.
fn trim_cut_word_at_start(b: &[u8], before: Option<u8>, far: Runs) -> &[u8] {
    let run = cut_word_len(b.iter(), before, far);
    trim_partial_head(&b[run..])
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// Whether the armour line starting at `at` names a private key.
fn names_private_key(b: &[u8], at: usize) -> bool {
    let line = &b[at..];
    let line = &line[..line.iter().position(|c| *c == b'\n').unwrap_or(line.len())];
    find(line, b"PRIVATE KEY").is_some()
}

/// The head without a private key block the cut left open (its BEGIN line and the lines
/// after it): redaction matches a whole block only.
fn open_key_block_cut_off(b: &[u8]) -> &[u8] {
    match rfind(b, b"-----BEGIN") {
        Some(at) if names_private_key(b, at) && find(&b[at..], b"-----END").is_none() => &b[..at],
        _ => b,
    }
}

/// The tail without the rest of a private key block whose start was cut off, up to the end
/// of its END line.
fn key_block_end_cut_off(b: &[u8]) -> &[u8] {
    let Some(at) = find(b, b"-----END") else {
        return b;
    };
    if !names_private_key(b, at) || find(&b[..at], b"-----BEGIN").is_some() {
        return b;
    }
    let end = b[at..]
        .iter()
        .position(|c| *c == b'\n')
        .map_or(b.len(), |n| at + n);
    &b[end..]
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

    /// Bytes of `out` that came from the stream: all but the marker.
    fn shown(out: &str) -> usize {
        match (out.find("\n\n... ["), out.find("] ...\n\n")) {
            (Some(a), Some(b)) => out.len() - (b + 7 - a),
            _ => out.len(),
        }
    }

    #[test]
    fn keeps_head_and_tail_and_counts_the_gap() {
        let mut c = HeadTail::new(10);
        for i in 0..100u8 {
            c.push(&[b'a' + (i % 26)]);
        }
        assert_eq!(c.total(), 100);
        let out = c.render("output");
        // One word of 100 letters: both cuts split it, so nothing of it is shown.
        assert_eq!(shown(&out), 0, "{out}");
        assert_eq!(c.omitted(), 100);
        let mut c = HeadTail::new(10);
        for i in 0..100u8 {
            c.push(&[b'a' + (i % 26)]);
            if i % 4 == 3 {
                c.push(b" ");
            }
        }
        // Head "abcd" (a space came next: no word split), tail " stuv ".
        let out = c.render("output");
        assert!(out.starts_with("abcd\n"), "{out}");
        assert!(out.ends_with(" stuv "), "{out}");
        assert_eq!(c.omitted(), 125 - 10);
        assert!(
            out.contains("[output truncated: 115 of 125 bytes omitted]"),
            "{out}"
        );
    }

    #[test]
    fn how_a_stream_is_chunked_does_not_change_what_is_kept() {
        // Words on both sides of MAX_CUT_WORD (some holding quotes and commas, which end a
        // token but not a word) and short ones, so the cuts fall in words and tokens of every
        // kind; chunks up to larger than the tail make every branch of `push` run, including
        // runs that leave through both halves of the tail's ring buffer.
        let mut seed = 0x2545_f491_u64;
        let mut next = |below: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % below
        };
        let mut stream = Vec::new();
        while stream.len() < 60_000 {
            let len = match next(3) {
                0 => 1 + next(8),
                _ => 1 + next(2 * MAX_CUT_WORD as u64),
            };
            let quoted = next(2) == 0;
            for i in 0..len {
                stream.push(if quoted && i % 1500 == 700 {
                    b'"'
                } else {
                    b'a' + (i % 26) as u8
                });
            }
            stream.push(if next(4) == 0 { b'\n' } else { b' ' });
        }
        // What is kept depends on the last pushes only (later bytes overwrite what the cut
        // measured), so many ends of the stream are tried, each cut into chunks three ways.
        for _ in 0..25 {
            let end = 20_000 + next(40_000) as usize;
            let stream = &stream[..end];
            for limit in [0, 64, 5_000, 12_000] {
                let mut whole = HeadTail::new(limit);
                whole.push(stream);
                let expected = (whole.render("output"), whole.omitted());
                for max_chunk in [97u64, 3_000, 20_000] {
                    let mut c = HeadTail::new(limit);
                    let mut rest = stream;
                    while !rest.is_empty() {
                        let n = 1 + next(max_chunk) as usize;
                        let (chunk, more) = rest.split_at(n.min(rest.len()));
                        c.push(chunk);
                        rest = more;
                    }
                    assert_eq!(
                        (c.render("output"), c.omitted()),
                        expected,
                        "{end} bytes, limit {limit}, chunks up to {max_chunk}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_secret_split_by_a_cut_is_dropped_with_the_cut() {
        let secret = "sk-Q9x7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0Ws";
        for at in [1, 16, 32] {
            let mut c = HeadTail::new(100);
            // The head (40 bytes) ends `at` bytes into the secret.
            c.push(format!("{}{}", "a ".repeat(20).get(at..).unwrap(), &secret[..at]).as_bytes());
            c.push(format!("{} and more", &secret[at..]).as_bytes());
            c.push("x ".repeat(200).as_bytes());
            c.push(format!("{secret} tail").as_bytes());
            let out = c.render("output");
            let head = &out[..out.find("\n\n...").unwrap()];
            assert!(!head.contains(&secret[..at]), "{at}: {out}");
            assert!(
                out.contains(secret),
                "a whole secret in the tail is kept for redaction"
            );
            assert_eq!(
                c.omitted() as usize,
                c.total() as usize - shown(&out),
                "{out}"
            );
        }
        // At the tail's cut.
        let mut c = HeadTail::new(100);
        c.push("head ".repeat(30).as_bytes());
        // The tail (60 bytes) starts 10 bytes before the secret's end.
        c.push(format!("{secret} then the rest{}", " r".repeat(18)).as_bytes());
        let out = c.render("output");
        assert!(!out.contains("0Ws"), "{out}");
        assert!(
            out.ends_with(&format!(" then the rest{}", " r".repeat(18))),
            "{out}"
        );
        assert_eq!(
            c.omitted() as usize,
            c.total() as usize - shown(&out),
            "{out}"
        );
    }

    #[test]
    fn a_private_key_cut_open_is_dropped_on_both_sides() {
        let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1\nQK8bXc2\n-----END RSA PRIVATE KEY-----\n";
        let mut c = HeadTail::new(60);
        c.push(b"before\n");
        c.push(key.as_bytes());
        c.push(b"after the key\n");
        let out = c.render("output");
        assert!(!out.contains("MIIE") && !out.contains("QK8b"), "{out}");
        assert!(
            out.starts_with("before\n") && out.ends_with("after the key\n"),
            "{out}"
        );
        assert_eq!(
            c.omitted() as usize,
            c.total() as usize - shown(&out),
            "{out}"
        );
        // A whole block on one side stays whole, for the redaction to replace.
        let mut c = HeadTail::new(400);
        c.push(key.as_bytes());
        c.push("z ".repeat(400).as_bytes());
        assert!(c.render("output").contains(key));
    }

    /// Minified JSON records (`{"id":1,"name":"user00001"},…`): one word of `len` bytes.
    fn minified(len: usize) -> String {
        let mut s = String::from("[");
        let mut i = 0;
        while s.len() < len {
            s.push_str(&format!("{{\"id\":{i},\"name\":\"user{i:05}\"}},"));
            i += 1;
        }
        s.truncate(len);
        s
    }

    #[test]
    fn a_token_in_a_word_longer_than_the_cut_word_limit_is_kept_or_dropped_whole() {
        // The probe's case: output of one 150 KB minified JSON line, capped at 50 KiB (head
        // 20480 bytes). Backing off a fixed 4 KiB from the head's cut made a new cut at 16384,
        // which showed `"token":"ghp_QQQ…` (26 of 36 characters) with no redaction.
        let secret = "ghp_Zq8XwKp2Lm7RtVb4Nc9Hd1Fg6Js3YaQeWu5T";
        let limit = 50 * 1024;
        let head_cap = limit * 2 / 5;
        let shown_parts = |out: &str| -> Vec<String> {
            (0..secret.len() - 6)
                .map(|i| &secret[i..i + 6])
                .filter(|w| out.contains(w))
                .map(str::to_string)
                .collect()
        };
        // Secret placed at the old 4 KiB back-off point, then split by the head's cut itself,
        // then by the tail's cut.
        for (at, whole_is_shown) in [
            (head_cap - MAX_CUT_WORD - 30, true),
            (head_cap - 20, false),
            (150_000 - (limit - head_cap) - 20, false),
        ] {
            let mut s = minified(150_000);
            let field = format!("\"token\":\"{secret}\"");
            s.replace_range(at - 9..at - 9 + field.len(), &field);
            let mut c = HeadTail::new(limit);
            for chunk in s.as_bytes().chunks(4096) {
                c.push(chunk);
            }
            let out = c.render("output");
            if whole_is_shown {
                // Whole, where the redaction replaces it.
                assert!(out.contains(secret), "{at}");
            } else {
                assert_eq!(shown_parts(&out), Vec::<String>::new(), "{at}");
                // Only the split token went, up to its quotes, not 4 KiB of records.
                assert!(
                    out.contains("\"token\":\"\n\n... [") || out.contains("] ...\n\n\""),
                    "{at}"
                );
                assert!(shown(&out) > limit - 64, "{at}: {} shown", shown(&out));
            }
            assert_eq!(
                c.omitted() as usize,
                c.total() as usize - shown(&out),
                "{at}"
            );
        }
    }

    #[test]
    fn a_cut_next_to_a_delimiter_in_a_long_word_drops_nothing() {
        // `…"name":"user00001"` | `},{…`: the cut split no token, and the word is too long to
        // drop whole.
        let head_cap = MAX_CUT_WORD + 100;
        let mut c = HeadTail::new(head_cap * 5 / 2);
        let word = format!("{}\"", "x".repeat(head_cap - 1));
        c.push(word.as_bytes());
        c.push(b"},{");
        c.push(&vec![b'y'; 20_000]);
        let out = c.render("output");
        assert!(
            out.starts_with(&format!("{word}\n\n... [")),
            "{}",
            &out[..50]
        );
        assert_eq!(c.omitted() as usize, c.total() as usize - shown(&out));
    }

    #[test]
    fn one_endless_word_keeps_its_head_and_tail_whole() {
        for (limit, chunk) in [(20_000, 100_000), (1_000, 100_000), (1_000, 7), (10, 1)] {
            let mut c = HeadTail::new(limit);
            for part in vec![b'w'; 100_000].chunks(chunk) {
                c.push(part);
            }
            let out = c.render("output");
            assert_eq!(shown(&out), limit, "{limit} {chunk}");
            assert!(out.starts_with(&"w".repeat(limit * 2 / 5)), "{out:.80}");
            assert_eq!(c.omitted() as usize, 100_000 - limit);
        }
    }

    #[test]
    fn a_word_split_by_a_cut_is_measured_on_both_sides() {
        // 300 bytes kept of a 3,000-byte word: short enough to be a secret, dropped whole.
        let mut c = HeadTail::new(1_000);
        c.push(b"kept ");
        c.push(&vec![b's'; 3_000]);
        c.push(" tail".repeat(300).as_bytes());
        let out = c.render("output");
        assert!(out.starts_with("kept \n\n... ["), "{out:.80}");
        // The same word at 5,000 bytes is longer than any secret the cut must hide.
        let mut c = HeadTail::new(1_000);
        c.push(b"kept ");
        c.push(&vec![b's'; 5_000]);
        c.push(" tail".repeat(300).as_bytes());
        let out = c.render("output");
        assert!(
            out.starts_with(&format!("kept {}\n\n", "s".repeat(395))),
            "{out:.80}"
        );
        // And at the tail's cut, counted back over what was omitted.
        let mut c = HeadTail::new(1_000);
        c.push("head ".repeat(300).as_bytes());
        for part in vec![b't'; 3_000].chunks(64) {
            c.push(part);
        }
        c.push(b" end");
        let out = c.render("output");
        assert!(out.ends_with("] ...\n\n end"), "{out}");
        let mut c = HeadTail::new(1_000);
        c.push("head ".repeat(300).as_bytes());
        for part in vec![b't'; 5_000].chunks(64) {
            c.push(part);
        }
        c.push(b" end");
        let out = c.render("output");
        assert!(out.ends_with(&format!("{} end", "t".repeat(596))), "{out}");
    }

    #[test]
    fn the_omitted_count_includes_a_broken_character_dropped_at_a_cut() {
        let mut c = HeadTail::new(10);
        c.push("a \u{20ac}\u{20ac}".as_bytes());
        c.push(" ".repeat(20).as_bytes());
        c.push("\u{20ac}\u{20ac}\u{20ac} \u{20ac}".as_bytes());
        let out = c.render("output");
        assert!(!out.contains('\u{FFFD}'), "{out}");
        assert_eq!(
            c.omitted() as usize,
            c.total() as usize - shown(&out),
            "{out}"
        );
    }

    #[test]
    fn a_single_huge_chunk_is_bounded() {
        let mut c = HeadTail::new(10);
        c.push(&vec![b'x'; 1_000_000]);
        assert_eq!(c.head.len() + c.tail.len(), 10);
        // One word far longer than any secret: both cuts keep their side of it.
        assert_eq!(c.omitted(), 1_000_000 - 10);
    }

    #[test]
    fn cuts_do_not_leave_broken_characters() {
        let mut c = HeadTail::new(10);
        c.push("ééééééééééééé".as_bytes());
        let out = c.render("output");
        assert!(!out.contains('\u{FFFD}'), "{out}");
    }
}
