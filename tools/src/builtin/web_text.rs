//! Turning a fetched page into text for `web_extract`: charset decoding and a bounded
//! HTML-to-text conversion.
//!
//! html5ever's tree builder scans its stack of open elements on most start tags ("is there a
//! `p` in button scope?"), so a page nesting N elements costs O(N²): 100,000 nested `<div>`s
//! took minutes, and nothing could stop it. Two bounds keep the work linear in the body:
//!
//! 1. a linear pre-pass ([`flatten_deep`]) runs html5ever's tokenizer alone and leaves out the
//!    tags of elements nested deeper than [`MAX_DEPTH`], keeping their text; the tree builder
//!    then never holds more than about that many open elements;
//! 2. the tree builder is fed in chunks and gives up once the call's deadline has passed, so
//!    whatever pathology the pre-pass does not foresee ends with the call instead of outliving it.
//!
//! Memory is the other bound. Each element costs about 1.6 KB on its way through html5ever's DOM
//! and html2text's render tree: a 5 MB page of `<ul><li>x</li></ul>` took the supervisor to
//! 850 MB (stop 60's probe), whatever the depth. So the pre-pass also keeps the tags of the first
//! [`MAX_ELEMENTS`] elements only; past them a page is text with a space where each tag was,
//! which keeps a page of that size to about 80 MB.

use html5ever::tendril::{StrTendril, TendrilSink};
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::Instant;

/// Deepest element nesting kept; elements below it lose their tags but keep their text. Real
/// pages stay far shallower (a few dozen levels); 256 is what browsers' layout engines allow
/// before they flatten too.
pub const MAX_DEPTH: usize = 256;

/// Elements whose tags the pre-pass keeps; the text of later ones stays, their tags go (see the
/// module docs). Large real pages have a few tens of thousands.
pub const MAX_ELEMENTS: usize = 50_000;

/// Input handed to the tree builder between deadline checks: small enough that one chunk
/// converts in milliseconds even at [`MAX_DEPTH`].
const CHUNK_BYTES: usize = 64 * 1024;

/// Why a page's HTML could not be turned into text.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The conversion was still running when the call's time was up.
    #[error(
        "converting the HTML to text did not finish within the web timeout ({0} s); \
         the page is too complex to convert — raise `web.timeout` or fetch a simpler page"
    )]
    TimedOut(u64),
    /// The execution whose script asked for the page ended first.
    #[error("the execution ended before the page was converted to text")]
    Abandoned,
    /// html2text refused the parsed document.
    #[error("could not convert HTML to text: {0}")]
    Html2Text(#[from] html2text::Error),
}

/// `body` as text: decoded with the charset the `Content-Type` header names, else the one a
/// `<meta charset>` near the start names (HTML only), else UTF-8; undecodable bytes become
/// U+FFFD. Unknown charset labels fall back the same way.
pub fn decode(body: &[u8], content_type: &str, is_html: bool) -> String {
    let from_header = charset_param(content_type);
    let from_meta = || {
        is_html
            .then(|| meta_charset(&body[..body.len().min(1024)]))
            .flatten()
    };
    let encoding = from_header
        .and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes()))
        .or_else(|| from_meta().and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes())))
        .unwrap_or(encoding_rs::UTF_8);
    // A byte-order mark wins over both, as in browsers (`decode` sniffs it).
    let (text, _, _) = encoding.decode(body);
    text.into_owned()
}

/// The `charset=` parameter of a Content-Type value.
fn charset_param(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches(['"', '\'']).to_string())
    })
}

/// The charset of a `<meta charset=…>` or `<meta http-equiv … content="…; charset=…">` in
/// `head` (the first KB, where HTML requires it to be).
fn meta_charset(head: &[u8]) -> Option<String> {
    let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
    let at = lower.find("charset=")? + "charset=".len();
    let rest = lower[at..].trim_start_matches(['"', '\'', ' ']);
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.')))
        .unwrap_or(rest.len());
    (end > 0 && lower[..at].contains("<meta")).then(|| rest[..end].to_string())
}

/// When a conversion must stop: the call's deadline, and whether the execution that asked for
/// the page has ended (a page converting for a script that is gone would only take memory and a
/// core from the executions after it).
pub struct Until<'a> {
    /// The call's deadline.
    pub deadline: Instant,
    /// The web timeout in seconds, for the error message.
    pub timeout_secs: u64,
    /// True once the calling execution has ended.
    pub ended: &'a dyn Fn() -> bool,
}

impl Until<'_> {
    /// `Err` once the conversion must stop, saying why.
    fn check(&self) -> Result<(), ConvertError> {
        if (self.ended)() {
            Err(ConvertError::Abandoned)
        } else if Instant::now() >= self.deadline {
            Err(ConvertError::TimedOut(self.timeout_secs))
        } else {
            Ok(())
        }
    }
}

/// `html` as wrapped plain text (html2text, 100 columns), stopping between chunks when `until`
/// says so.
pub fn html_to_text(html: &str, until: &Until<'_>) -> Result<String, ConvertError> {
    let flat = flatten_deep(html, until)?;
    let dom = parse_until(&flat, until)?;
    drop(flat);
    // Past the tree builder the depth is bounded, so html2text's own passes are linear. Wider
    // than 100 columns rather than nothing: 60 nested lists indent past 100, which failed the
    // whole page ("Output width not wide enough"); and deep text still gets 20 columns, not 3
    // (a word cut every 3 letters is no text).
    let cfg = html2text::config::plain()
        .allow_width_overflow()
        .min_wrap_width(20);
    let tree = cfg.dom_to_render_tree(&dom)?;
    drop(dom);
    Ok(cfg.render_to_string(tree, 100)?)
}

/// Parses `html` into html2text's DOM chunk by chunk, asking `until` between chunks.
fn parse_until(html: &str, until: &Until<'_>) -> Result<html2text::RcDom, ConvertError> {
    let mut parser = html5ever::parse_document(html2text::RcDom::default(), Default::default());
    for chunk in chunks(html) {
        until.check()?;
        parser.process(StrTendril::from_slice(chunk));
    }
    Ok(parser.finish())
}

/// `text` in pieces of about [`CHUNK_BYTES`], cut at character boundaries.
fn chunks(mut text: &str) -> impl Iterator<Item = &str> {
    std::iter::from_fn(move || {
        if text.is_empty() {
            return None;
        }
        let mut cut = text.len().min(CHUNK_BYTES);
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        let (piece, rest) = text.split_at(cut);
        text = rest;
        Some(piece)
    })
}

/// Elements that never have content (no end tag, no depth).
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
    "source", "track", "wbr",
];

/// Start tags that close an open element of the same kind (`<li>` after `<li>`), with the
/// elements that fence that search off (a nested list). Without this, a page of unclosed
/// `<p>`s or `<li>`s would look thousands of levels deep to the pre-pass.
fn closes_previous(name: &str) -> Option<(&'static [&'static str], &'static [&'static str])> {
    const BLOCK_FENCE: &[&str] = &["table", "td", "th", "button", "html", "object", "template"];
    Some(match name {
        "li" => (&["li"], &["ul", "ol", "menu", "table", "td", "th"]),
        "dt" | "dd" => (&["dt", "dd"], &["dl", "table", "td", "th"]),
        "tr" => (&["tr", "td", "th"], &["table", "thead", "tbody", "tfoot"]),
        "td" | "th" => (&["td", "th"], &["tr", "table"]),
        "thead" | "tbody" | "tfoot" => (&["thead", "tbody", "tfoot", "tr", "td", "th"], &["table"]),
        "option" => (&["option"], &["select", "datalist"]),
        "p" | "div" | "ul" | "ol" | "dl" | "table" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6"
        | "pre" | "blockquote" | "section" | "article" | "aside" | "header" | "footer" | "nav"
        | "main" | "form" | "figure" | "fieldset" | "address" | "details" | "hr" => {
            (&["p"], BLOCK_FENCE)
        }
        _ => return None,
    })
}

/// The pre-pass's state: the HTML written so far and its own (approximate) open elements.
#[derive(Default)]
struct Flattener {
    out: String,
    open: Vec<String>,
    /// Elements whose tags were written ([`MAX_ELEMENTS`]).
    kept: usize,
    /// Inside script/style and the like: text goes out as it came (no entity decoding happened).
    raw: bool,
}

impl Flattener {
    fn start(&mut self, tag: &html5ever::tokenizer::Tag) -> TokenSinkResult<()> {
        let name: &str = &tag.name;
        if let Some((closes, fence)) = closes_previous(name) {
            let found = self
                .open
                .iter()
                .rposition(|o| closes.contains(&o.as_str()) || fence.contains(&o.as_str()));
            if let Some(i) = found.filter(|&i| closes.contains(&self.open[i].as_str())) {
                self.open.truncate(i);
            }
        }
        let void = VOID.contains(&name) || tag.self_closing;
        // Too deep: the tag goes, its text stays. Raw-text elements (script, style, title…)
        // stay even then: they hold no elements, so cost one level at most, and without their
        // tag a script's source would come out as page text.
        if !void && self.open.len() >= MAX_DEPTH && raw_kind(name).is_none() {
            return TokenSinkResult::Continue;
        }
        // Too many: the tag goes, a space stays so that the texts on either side stay words.
        if self.kept >= MAX_ELEMENTS && raw_kind(name).is_none() {
            self.out.push(' ');
            return TokenSinkResult::Continue;
        }
        self.kept += 1;
        self.out.push('<');
        self.out.push_str(name);
        for a in &tag.attrs {
            let _ = write!(self.out, " {}=\"", &*a.name.local);
            escape_into(&mut self.out, &a.value, true);
            self.out.push('"');
        }
        if tag.self_closing {
            self.out.push('/');
        }
        self.out.push('>');
        if !void {
            self.open.push(name.to_string());
        }
        match raw_kind(name) {
            Some(kind) => {
                self.raw = !matches!(kind, RawKind::Rcdata);
                TokenSinkResult::RawData(kind)
            }
            None if name == "plaintext" => {
                self.raw = true;
                TokenSinkResult::Plaintext
            }
            None => TokenSinkResult::Continue,
        }
    }

    fn end(&mut self, name: &str) {
        self.raw = false;
        // An end tag of nothing open here belonged to a left-out element (or to nothing, which
        // the tree builder would have ignored): it goes too.
        if let Some(i) = self.open.iter().rposition(|o| o == name) {
            self.open.truncate(i);
            let _ = write!(self.out, "</{name}>");
        }
    }
}

/// The tokenizer state a start tag switches to, as the tree builder would (scripting on).
fn raw_kind(name: &str) -> Option<RawKind> {
    match name {
        "title" | "textarea" => Some(RawKind::Rcdata),
        "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => Some(RawKind::Rawtext),
        "script" => Some(RawKind::ScriptData),
        _ => None,
    }
}

fn escape_into(out: &mut String, text: &str, attr: bool) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attr => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// The tokenizer's sink (it takes `&self`, hence the cell).
struct FlattenSink(RefCell<Flattener>);

impl TokenSink for FlattenSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut f = self.0.borrow_mut();
        match token {
            Token::TagToken(tag) => match tag.kind {
                TagKind::StartTag => return f.start(&tag),
                TagKind::EndTag => f.end(&tag.name),
            },
            Token::CharacterTokens(text) => {
                if f.raw {
                    f.out.push_str(&text);
                } else {
                    escape_into(&mut f.out, &text, false);
                }
            }
            // Comments, doctypes, NULs and parse errors carry no text.
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// `html` with the tags of elements nested deeper than [`MAX_DEPTH`], and of those past the
/// first [`MAX_ELEMENTS`], left out (their text kept), in one linear pass of html5ever's
/// tokenizer; `Err` when `until` said stop first (asked between chunks: linear is still a
/// second or so for 5 MB in a release build).
pub fn flatten_deep(html: &str, until: &Until<'_>) -> Result<String, ConvertError> {
    let sink = FlattenSink(RefCell::new(Flattener {
        out: String::with_capacity(html.len()),
        ..Flattener::default()
    }));
    let tokenizer = Tokenizer::new(sink, TokenizerOpts::default());
    let input = BufferQueue::default();
    for chunk in chunks(html) {
        until.check()?;
        input.push_back(StrTendril::from_slice(chunk));
        // The sink never asks to stop (no scripts run), so one feed reads the whole chunk.
        let _ = tokenizer.feed(&input);
    }
    tokenizer.end();
    Ok(tokenizer.sink.0.take().out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn within(secs: u64) -> Until<'static> {
        Until {
            deadline: Instant::now() + Duration::from_secs(secs),
            timeout_secs: secs,
            ended: &|| false,
        }
    }

    fn nested(n: usize) -> String {
        format!(
            "<html><body>{}x{}</body></html>",
            "<div>".repeat(n),
            "</div>".repeat(n)
        )
    }

    #[test]
    fn deep_nesting_converts_in_linear_time_and_keeps_the_text() {
        // Before the pre-pass, 20,000 levels took seconds (debug build: ~2 minutes).
        let html = format!("{}<p>after</p>", nested(20_000));
        let started = Instant::now();
        let text = html_to_text(&html, &within(60)).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(text.contains('x') && text.contains("after"), "{text}");
    }

    #[test]
    fn shallow_pages_are_unchanged_by_the_pre_pass() {
        let html = "<html><head><title>T &amp; U</title><script>if (a < b && c) {}</script>\
                    </head><body><ul><li>one<li>two</ul><p>a &lt;tag&gt; <a href=\"/x?a=1&amp;b=2\">link</a>\
                    <p>second<br>line<table><tr><td>c1<td>c2<tr><td>c3</table></body></html>";
        let cfg = html2text::config::plain();
        let direct = cfg.string_from_read(html.as_bytes(), 100).unwrap();
        let ours = html_to_text(html, &within(10)).unwrap();
        assert_eq!(ours, direct);
        // Many unclosed paragraphs are not "deep".
        let many = "<p>para".repeat(1000) + "<p>last";
        let flat = flatten_deep(&many, &within(10)).unwrap();
        assert_eq!(flat.matches("<p>").count(), 1001);
    }

    #[test]
    fn a_passed_deadline_or_an_ended_execution_stops_the_conversion() {
        let passed = Until {
            deadline: Instant::now(),
            timeout_secs: 3,
            ended: &|| false,
        };
        let err = html_to_text(&nested(10), &passed).unwrap_err();
        assert!(err.to_string().contains("web timeout (3 s)"), "{err}");
        let ended = Until {
            ended: &|| true,
            ..within(60)
        };
        let err = html_to_text(&nested(10), &ended).unwrap_err();
        assert!(matches!(err, ConvertError::Abandoned), "{err}");
    }

    #[test]
    fn past_the_element_cap_a_page_keeps_its_text_as_words() {
        // 5 MB of one-item lists took the supervisor to 850 MB before the cap.
        let items = MAX_ELEMENTS + 10_000;
        let html = format!(
            "<html><body>{}</body></html>",
            "<ul><li>w</li></ul>".repeat(items)
        );
        let flat = flatten_deep(&html, &within(60)).unwrap();
        let tags = flat.matches('<').count() / 2;
        assert!(tags <= MAX_ELEMENTS, "{tags} elements kept");
        let text = html_to_text(&html, &within(60)).unwrap();
        assert_eq!(text.matches('w').count(), items, "text was lost");
        assert!(!text.contains("ww"), "words were glued together");
    }

    #[test]
    fn deeply_nested_lists_convert_instead_of_failing_the_page() {
        // 60 nested lists indent past 100 columns: "Output width not wide enough".
        let html = format!("{}deep{}", "<ul><li>".repeat(80), "</li></ul>".repeat(80));
        let text = html_to_text(&html, &within(60)).unwrap();
        assert!(text.contains("deep"), "{text}");
    }

    #[test]
    fn charsets_come_from_the_header_then_the_meta_tag() {
        assert_eq!(
            decode(b"caf\xe9", "text/html; charset=iso-8859-1", true),
            "café"
        );
        assert_eq!(
            decode(b"caf\xe9", "text/plain; charset=\"ISO-8859-1\"", false),
            "café"
        );
        let meta = b"<html><head><meta charset=\"windows-1252\"></head><body>caf\xe9";
        assert!(decode(meta, "text/html", true).ends_with("café"));
        assert_eq!(decode("café".as_bytes(), "text/html", true), "café");
        assert_eq!(
            decode(b"caf\xe9", "text/html; charset=bogus", true),
            "caf\u{fffd}"
        );
    }
}
