//! What an approval is about and how it is answered, and the normal form of a command that
//! the pattern tiers match. Both halves of approval use these — [`crate::approval`] (the
//! decision order) and [`crate::approval_policy`] (hardline tier, deny rules, smart approver,
//! asking a host) — so they live below both and the two import them from here rather than
//! from each other. Public through `crate::approval`.

use crate::CallOrigin;
use regex::Regex;
use std::collections::{HashMap, VecDeque};
use std::sync::LazyLock;

static IFS: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\$\{?ifs\}?(?:\$[0-9@*])?").ok());
static COMMAND_PATH: LazyLock<Option<Regex>> = LazyLock::new(|| {
    // Only cut paths in front of command names the patterns know, so `/etc/passwd` as an
    // argument stays a path.
    Regex::new(
        r"(^|[\s;&|(`])(?:[a-z0-9_.~-]*/)+(rm|dd|mkfs(?:\.[a-z0-9]+)?|mke2fs|wipefs|fdisk|sfdisk|parted|shred|chmod|chown|chgrp|kill|killall5?|pkill|systemctl|service|shutdown|reboot|halt|poweroff|init|telinit|sh|bash|zsh|dash|ksh|curl|wget|git|sudo|python[0-9.]*|perl|ruby|node|base64|xxd|openssl|find|tee|cp|mv|sed|truncate|eval|env|nohup|nice|xargs|busybox|psql|mysql|sqlite3)(\s|$)",
    )
    .ok()
});
static SPACES: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"[ \t\r\x0b\x0c]+").ok());
/// Doubled slashes and `/./` in paths (`//etc`, `/./etc` are `/etc`); not the `//` of a URL.
static SLASHES: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"(^|[^:/])/(?:\.?/)+").ok());
/// An absolute path with a `..` component (`/tmp/../etc`, `/srv/..`), as a word of the line.
static DOT_DOT_PATH: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(^|[\s;&|(){}<>=`])(/(?:[^\s;&|(){}<>`]*/)?\.\.(?:/[^\s;&|(){}<>`]*)?)($|[\s;&|(){}<>`])",
    )
    .ok()
});

/// `text` (a command or script a person is asked about) as it is shown to them on a terminal
/// or in a client's form: newlines and tabs kept, every other character that could draw over
/// or hide part of the prompt escaped ([`crate::error::escaped_for_display`]).
pub fn shown_to_a_person(text: &str) -> String {
    crate::error::escaped_for_display(text, crate::error::LineBreaks::Kept)
}

/// The form of a command that patterns are matched against: lower-case, line continuations
/// joined, quotes and backslashes removed, `$IFS` as a space, `/usr/bin/rm` as `rm`, `//etc`
/// and `/./etc` as `/etc`, `/tmp/../etc` as `/etc`, `>|` as `>`, whitespace runs collapsed. A
/// newline ends a command (`;`) except inside a quoted string or a heredoc body, where it is
/// whitespace (SQL split over lines reads as one statement).
pub fn normalize_command(command: &str) -> String {
    finish(&join_lines(&command.to_lowercase().replace("\\\n", " ")))
}

/// Every form of `command` the pattern tiers look at; a pattern matches the command when it
/// matches one of them, so each extra view can only add matches:
///
/// 1. [`normalize_command`];
/// 2. the same with *every* newline as `;` (the quote and heredoc tracking of the first view is
///    a best effort — a stray apostrophe in a comment must not hide the lines after it);
/// 3. the first view with what the shell would plainly expand put in: variables assigned a
///    literal in the same line (`X=rm; $X -rf` is `rm -rf`), `${X:-word}`, `$(echo word)`,
///    brace lists (`-{r,f}` is `-r -f`), a glob naming top-level directories (`/e*` is `/etc`),
///    SQL comments (`DROP/**/TABLE`), and wrappers in front of a command (`sudo -u x`, `env`,
///    `command`, `exec`, `nohup`, `nice`, `xargs`, `bash -c`, …) removed.
/// 4. the first view without lower-casing, for the few options whose case is their meaning
///    (`git branch -D` deletes unmerged work, `-d` does not); patterns written in lower case
///    match it only where the command was lower case anyway.
///
/// A command with ANSI-C quoted words (`$'\162\155'` is `rm`, `$'/dev/vda'` is `/dev/vda`) or
/// substituted `printf` escapes gets these views twice: as written and decoded
/// ([`decode_spellings`]).
pub fn command_views(command: &str) -> Vec<String> {
    let mut views = Vec::new();
    let own = own_paths();
    let decoded = decode_spellings(command);
    for command in std::iter::once(command).chain(decoded.as_deref()) {
        let lower = command.to_lowercase().replace("\\\n", " ");
        let primary = finish(&join_lines(&lower));
        let flat = finish(&lower.replace('\n', " ; "));
        let expanded = expand(&primary, &own, names_home(command));
        let cased = finish(&join_lines(&command.replace("\\\n", " ")));
        for v in [primary, flat, expanded, cased] {
            if !views.contains(&v) {
                views.push(v);
            }
        }
    }
    views
}

/// `command` with the words bash decodes put as it decodes them, `None` when it has none:
/// each ANSI-C quoted word (`$'…'`) in single quotes (a quote it holds dropped: the views drop
/// quotes anyway; cut at a NUL, as bash cuts it), then `printf`/`echo -e` output a command
/// substitutes ([`decode_printed`]). Escapes: `\a \b \e \E \f \n \r \t \v \\ \' \" \?`, octal
/// `\nnn`, `\xHH`, `\uHHHH`, `\UHHHHHHHH` and `\cX`; an unterminated `$'` is left as it is.
pub(crate) fn decode_spellings(command: &str) -> Option<String> {
    let decoded = decode_ansi_c_words(command);
    let text = decoded.as_deref().unwrap_or(command);
    match decode_printed(text) {
        Some(printed) => Some(printed),
        None => decoded,
    }
}

/// `printf` (and `echo -e`) output a command substitutes, decoded: `$(printf '\x72\x6d -rf
/// d')` is `$(echo rm -rf d)` (which the third view reads as `rm -rf d`), as is `<(printf …)`
/// and `` `printf …` ``; `printf -v C '\x72\x6d'` is `C=rm`. `%s`, `%b`, `%c` and `%d` take the
/// arguments in order. `None` when there is nothing to decode.
fn decode_printed(command: &str) -> Option<String> {
    let (Some(subst), Some(assign)) = (PRINTF_SUBST.as_ref(), PRINTF_ASSIGN.as_ref()) else {
        return None;
    };
    if !subst.is_match(command) && !assign.is_match(command) {
        return None;
    }
    let format_of = |c: &regex::Captures| {
        c.name("sq")
            .or_else(|| c.name("dq"))
            .or_else(|| c.name("bare"))
            .map_or("", |m| m.as_str())
            .to_string()
    };
    let out = subst.replace_all(command, |c: &regex::Captures| {
        let args = c.name("args").map_or("", |m| m.as_str());
        let printed = printf_output(&format_of(c), args);
        format!(
            "{}echo {}{}",
            &c["open"],
            printed.replace(['(', ')', '`'], " "),
            &c["close"]
        )
    });
    let out = assign.replace_all(&out, |c: &regex::Captures| {
        let printed = printf_output(&format_of(c), c.name("args").map_or("", |m| m.as_str()));
        format!(
            "{}={}",
            &c["name"],
            printed.replace(char::is_whitespace, "")
        )
    });
    Some(out.into_owned())
}

/// What `printf FORMAT ARGS` prints, near enough to judge it: the format's escapes decoded as
/// in `$'…'`, its conversions filled with the arguments in order (quotes dropped).
fn printf_output(format: &str, args: &str) -> String {
    let body = format!("{}'", format.replace('\'', "\\'"));
    let text = decode_ansi_c_body(&body).map_or_else(|| format.to_string(), |(t, _)| t);
    let mut args = args
        .split_whitespace()
        .map(|a| a.trim_matches(['\'', '"']).to_string());
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('s' | 'b' | 'c' | 'd' | 'i') => out.push_str(&args.next().unwrap_or_default()),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// [`decode_spellings`]'s first half: the `$'…'` words alone.
fn decode_ansi_c_words(command: &str) -> Option<String> {
    if !command.contains("$'") {
        return None;
    }
    let mut out = String::with_capacity(command.len());
    let mut rest = command;
    while let Some(start) = rest.find("$'") {
        out.push_str(&rest[..start]);
        let body = &rest[start + 2..];
        match decode_ansi_c_body(body) {
            Some((text, used)) => {
                out.push('\'');
                out.extend(text.chars().filter(|&c| c != '\''));
                out.push('\'');
                rest = &body[used..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    Some(out)
}

/// The text of one `$'…'` body (after the `$'`) and the bytes it used, closing quote
/// included; `None` when it never closes.
fn decode_ansi_c_body(body: &str) -> Option<(String, usize)> {
    let mut text = String::new();
    let mut chars = body.char_indices().peekable();
    // Up to `max` digits of `radix` after an escape letter, as one code point.
    let digits = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
                  radix: u32,
                  max: usize,
                  first: Option<u32>| {
        let mut value = first.unwrap_or(0);
        let mut n = usize::from(first.is_some());
        while n < max {
            match chars.peek().and_then(|&(_, c)| c.to_digit(radix)) {
                Some(d) => {
                    value = value.saturating_mul(radix).saturating_add(d);
                    chars.next();
                    n += 1;
                }
                None => break,
            }
        }
        (n > 0).then_some(value)
    };
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' => {
                // bash ends the word at a NUL (`rm -r$'\0' d` is `rm -r d`).
                if let Some(nul) = text.find('\0') {
                    text.truncate(nul);
                }
                return Some((text, i + 1));
            }
            '\\' => {
                let (_, e) = chars.next()?;
                let code = match e {
                    'a' => Some(0x07),
                    'b' => Some(0x08),
                    'e' | 'E' => Some(0x1b),
                    'f' => Some(0x0c),
                    'n' => Some(0x0a),
                    'r' => Some(0x0d),
                    't' => Some(0x09),
                    'v' => Some(0x0b),
                    '0'..='7' => digits(&mut chars, 8, 3, e.to_digit(8)),
                    'x' => digits(&mut chars, 16, 2, None),
                    'u' => digits(&mut chars, 16, 4, None),
                    'U' => digits(&mut chars, 16, 8, None),
                    'c' => chars.next().map(|(_, x)| u32::from(x) & 0x1f),
                    other => {
                        // `\\`, `\'`, `\"`, `\?` are the character; bash keeps the backslash
                        // of an unknown escape.
                        if !matches!(other, '\\' | '\'' | '"' | '?') {
                            text.push('\\');
                        }
                        Some(u32::from(other))
                    }
                };
                match code.and_then(char::from_u32) {
                    Some(ch) => text.push(ch),
                    // `\x` without digits is kept as written; a value that is no character
                    // (a lone surrogate) is dropped, as nothing can match it.
                    None if code.is_none() => {
                        text.push('\\');
                        text.push(e);
                    }
                    None => {}
                }
            }
            c => text.push(c),
        }
    }
    None
}

/// Quotes, backslashes, `$IFS`, spacing, doubled slashes and command paths (see
/// [`normalize_command`]), after the lines were joined.
fn finish(joined: &str) -> String {
    let mut s = joined.replace(['\'', '"', '\\'], "").replace(">|", ">");
    if let Some(re) = IFS.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    if let Some(re) = SPACES.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    if let Some(re) = SLASHES.as_ref() {
        s = re.replace_all(&s, "$1/").into_owned();
    }
    s = resolve_dot_dot(s);
    cut_command_paths(s).trim().to_string()
}

/// An absolute path with its `..` components resolved by name, as the tiers must read it:
/// `rm -rf /tmp/../*` deletes `/*`. (A symlink before the `..` would lead elsewhere in the
/// kernel; by name is what can be judged from the text.) A trailing slash is kept.
fn without_dot_dot(path: &str) -> String {
    // The planner's lexical cleaning (file_lock uses it too); a path cut from a `&str` is
    // UTF-8, so nothing is lost converting back.
    let mut out = crate::planner::lexical(std::path::Path::new(path))
        .to_string_lossy()
        .into_owned();
    if path.ends_with('/') && out != "/" {
        out.push('/');
    }
    out
}

fn cut_command_paths(mut s: String) -> String {
    if let Some(re) = COMMAND_PATH.as_ref() {
        // Twice, because a match consumes the separator the next command name needs.
        for _ in 0..2 {
            s = re.replace_all(&s, "$1$2$3").into_owned();
        }
    }
    s
}

/// Joins the lines of a (lower-cased) command: a newline becomes ` ; ` where it ends a
/// command, and a space inside a quoted string or a heredoc body, where the shell passes it on
/// as data (a SQL statement split over lines is one statement).
fn join_lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let mut quote: Option<char> = None;
    let mut pending: VecDeque<(String, bool)> = VecDeque::new();
    let mut body: Option<(String, bool)> = None;
    for (i, line) in s.split('\n').enumerate() {
        if i > 0 {
            out.push_str(if quote.is_some() || body.is_some() {
                " "
            } else {
                " ; "
            });
        }
        out.push_str(line);
        if let Some((delim, tabs)) = &body {
            let l = if *tabs {
                line.trim_start_matches('\t')
            } else {
                line
            };
            if l.trim_end() == delim {
                body = pending.pop_front();
            }
            continue;
        }
        scan_line(line, &mut quote, &mut pending);
        if quote.is_none() {
            body = pending.pop_front();
        }
    }
    out
}

/// Follows quoting through one line outside a heredoc body, and notes the delimiters of the
/// heredocs it opens (`<<EOF`, `<<-'EOF'`), whose bodies start on the next line.
fn scan_line(line: &str, quote: &mut Option<char>, pending: &mut VecDeque<(String, bool)>) {
    let b: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match *quote {
            Some('\'') => {
                if c == '\'' {
                    *quote = None;
                }
            }
            Some(_) => {
                if c == '\\' {
                    i += 1;
                } else if c == '"' {
                    *quote = None;
                }
            }
            None => match c {
                '\\' => i += 1,
                '\'' | '"' => *quote = Some(c),
                '#' if i == 0 || b[i - 1].is_whitespace() => break,
                '<' if b.get(i + 1) == Some(&'<') => {
                    if b.get(i + 2) == Some(&'<') {
                        // A here-string (`<<<`): no body follows.
                        i += 3;
                        continue;
                    }
                    let mut j = i + 2;
                    let tabs = b.get(j) == Some(&'-');
                    if tabs {
                        j += 1;
                    }
                    while b.get(j).is_some_and(|c| *c == ' ' || *c == '\t') {
                        j += 1;
                    }
                    let mut delim = String::new();
                    while let Some(&d) = b.get(j) {
                        if d.is_whitespace() || ";&|<>()".contains(d) {
                            break;
                        }
                        if !matches!(d, '\'' | '"' | '\\') {
                            delim.push(d);
                        }
                        j += 1;
                    }
                    if !delim.is_empty() {
                        pending.push_back((delim, tabs));
                    }
                    i = j;
                    continue;
                }
                _ => {}
            },
        }
        i += 1;
    }
}

static SQL_COMMENT: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"/\*.*?\*/").ok());
/// Arithmetic on one literal, `$((-1))` or `$(( 1 ))`: the shell puts the number in.
static ARITHMETIC: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\$\(\(\s*(-?\s*[0-9]+)\s*\)\)").ok());
static ECHO_SUBST: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"\$\(\s*(?:echo|printf)(?:\s+-[a-z]+)*\s+([^()`;&|]*?)\s*\)|`\s*(?:echo|printf)(?:\s+-[a-z]+)*\s+([^()`;&|]*?)\s*`",
    )
    .ok()
});
static ASSIGNMENT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(?:^|[;&|({`]\s*|\b(?:export|local|readonly|declare|typeset)\s+(?:-\S+\s+)*)([a-z_][a-z0-9_]*)=([^\s;&|()`]*)",
    )
    .ok()
});
static VARIABLE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"\$\{([a-z_][a-z0-9_]*)(?::?[-=]([^}]*))?\}|\$([a-z_][a-z0-9_]*)").ok()
});
static BRACE_LIST: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^([^{}]*?)\{([^{}]*,[^{}]*)\}([^{}]*)$").ok());
static ROOT_GLOB: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^(/+)([^/]*[*?\[][^/]*)(/.*)?$").ok());
/// Commands that run the command after them (their own options skipped).
static WRAPPER: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(^|;|&&|\|\||&|\||\(|`|\{)\s*(?:sudo(?:\s+(?:-[ughpcdrt]\s+[^\s;&|]+|-[^\s;&|]+))*|doas(?:\s+-u\s+\S+)?|env(?:\s+-[^\s;&|]+)*(?:\s+[a-z_][a-z0-9_]*=[^\s;&|]*)*|command(?:\s+-[a-z]+)*|exec(?:\s+-[a-z]+)*|eval|nohup|setsid|nice(?:\s+-n\s*-?[0-9]+|\s+-[^\s;&|]+)*|ionice(?:\s+-[^\s;&|]+)*|time(?:\s+-p)?|busybox|stdbuf(?:\s+-[^\s;&|]+)*|timeout(?:\s+-[^\s;&|]+)*\s+[0-9.]+[smhd]?|xargs(?:\s+-[0-9a-z]+)*)\s+",
    )
    .ok()
});
/// `sh -c` in front of a command (not after a pipe, where it is the shell being fed).
static SHELL_C: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(^|;|&&|\|\||&|\(|`|\{)\s*(?:ba|z|da|k)?sh\s+(?:-[a-z]+\s+)*-c\s+").ok()
});

/// `/proc/self/root` (or `/proc/<pid>/root`, `/proc/thread-self/root`) in front of a path: the
/// same file through the process's root (`/proc/self/root/dev/vda` is `/dev/vda`).
static PROC_ROOT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(^|[\s;&|(){}<>=`])/proc/(?:self|thread-self|[0-9]+)/root(/|[\s;&|(){}<>`]|$)")
        .ok()
});
/// A path ending in `/.` (`/.`, `/etc/.`): the directory itself.
static TRAILING_DOT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(/)\.([\s;&|(){}<>`]|$)").ok());
/// A `~` that the shell expands to the home directory (a word's start, or after `=` or `:`).
static TILDE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(^|[\s=:;&|(`])~(/|[\s;&|)`]|$)").ok());
/// A one-character bracket expression (`r[m]`, `/et[c]`), which the shell's globbing turns into
/// that character wherever the file exists.
static ONE_CHAR_CLASS: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\[([^\]\[!^\s/])\]").ok());
/// A command name written as a glob (`/usr/bin/r?`, `/bin/da?h`): in command position, after a
/// separator or at the start.
static COMMAND_GLOB: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(^|[;&|(`{]\s*)([^\s;&|()`{}]*[*?\[][^\s;&|()`{}]*)(\s|$|[;&|)])").ok()
});

/// `$(printf FORMAT ARGS)`, `<(…)`, `` `…` ``, and `echo -e` in their place.
static PRINTF_SUBST: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"(?P<open>\$\(|<\(|`)\s*(?:printf(?:\s+--)?|echo\s+-[a-zA-Z]*e[a-zA-Z]*)\s+(?:'(?P<sq>[^']*)'|"(?P<dq>[^"]*)"|(?P<bare>[^\s)`]+))(?P<args>[^)`]*)(?P<close>\)|`)"#,
    )
    .ok()
});
/// `printf -v NAME FORMAT ARGS`: an assignment.
static PRINTF_ASSIGN: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"\bprintf\s+-v\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s+(?:'(?P<sq>[^']*)'|"(?P<dq>[^"]*)"|(?P<bare>[^\s;&|]+))(?P<args>[^;&|\n]*)"#,
    )
    .ok()
});
/// A path whose last component is a glob (`/usr/bin/r?`), as a word anywhere.
static GLOBBED_PATH: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(^|[\s=;&|(`{])([^\s;&|()`{}]*/)([^\s/;&|()`{}]*[*?\[][^\s/;&|()`{}]*)(\s|$|[;&|)])",
    )
    .ok()
});

/// The command names a glob in command position is tried against: those the patterns name.
const GLOBBED_COMMANDS: [&str; 36] = [
    "rm",
    "dd",
    "mkfs",
    "mke2fs",
    "wipefs",
    "fdisk",
    "sfdisk",
    "parted",
    "shred",
    "chmod",
    "chown",
    "chgrp",
    "kill",
    "killall",
    "pkill",
    "systemctl",
    "service",
    "shutdown",
    "reboot",
    "halt",
    "poweroff",
    "sh",
    "bash",
    "rbash",
    "dash",
    "zsh",
    "ksh",
    "curl",
    "wget",
    "git",
    "sudo",
    "python3",
    "perl",
    "find",
    "tee",
    "truncate",
];

/// Top-level directories a glob such as `/e*` or `/[u]sr` is checked against.
const TOP_LEVEL: [&str; 17] = [
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "opt", "proc", "root", "run",
    "sbin", "srv", "sys", "usr", "var",
];

/// Whether `command` reads the variable `HOME` (`$HOME`, `${HOME}`, `${HOME:-…}`), spelled in
/// capitals: the views are lower case, and a lower-case `$home` is another, usually unset,
/// variable.
fn names_home(command: &str) -> bool {
    command.contains("$HOME") || command.contains("${HOME")
}

/// The home directory as the views spell it (lower case), when there is one.
fn home_as_viewed() -> Option<String> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| h.to_string_lossy().to_lowercase())
}

/// The third view of [`command_views`]: plain shell expansions put in, wrappers removed.
/// `$HOME`, where the line reads it (`home`) without assigning it, is the home directory, as
/// `~` is ([`same_files`]): `rm -rf $HOME` is `rm -rf ~`.
fn expand(primary: &str, own: &[(String, &str)], home: bool) -> String {
    let mut s = same_files(primary, own);
    if let Some(re) = SQL_COMMENT.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    if let Some(re) = ECHO_SUBST.as_ref() {
        s = re
            .replace_all(&s, |c: &regex::Captures| {
                c.get(1)
                    .or_else(|| c.get(2))
                    .map_or(String::new(), |m| m.as_str().to_string())
            })
            .into_owned();
    }
    if let (Some(assign), Some(var)) = (ASSIGNMENT.as_ref(), VARIABLE.as_ref()) {
        // Two rounds, for `A=rm; B=$A; $B -rf x`.
        for _ in 0..2 {
            let mut values: HashMap<String, String> = assign
                .captures_iter(&s)
                .filter_map(|c| {
                    Some((
                        c.get(1)?.as_str().to_string(),
                        c.get(2)?.as_str().to_string(),
                    ))
                })
                .collect();
            if home && !values.contains_key("home") {
                if let Some(h) = home_as_viewed() {
                    values.insert("home".to_string(), h);
                }
            }
            s = var
                .replace_all(&s, |c: &regex::Captures| {
                    let name = c.get(1).or_else(|| c.get(3)).map_or("", |m| m.as_str());
                    match (values.get(name), c.get(2)) {
                        (Some(v), _) => v.clone(),
                        (None, Some(default)) => default.as_str().to_string(),
                        (None, None) => c[0].to_string(),
                    }
                })
                .into_owned();
        }
    }
    if let Some(re) = ARITHMETIC.as_ref() {
        s = re
            .replace_all(&s, |c: &regex::Captures| c[1].replace(' ', ""))
            .into_owned();
    }
    s = s.split(' ').map(expand_word).collect::<Vec<_>>().join(" ");
    for re in [WRAPPER.as_ref(), SHELL_C.as_ref()].into_iter().flatten() {
        // A few rounds: `sudo env nohup reboot`.
        for _ in 0..4 {
            let next = re.replace_all(&s, "$1 ").into_owned();
            if next == s {
                break;
            }
            s = next;
        }
    }
    // A globbed name the wrappers stood in front of is in command position now (`env r? …`).
    s = globbed_commands(&s);
    if let Some(re) = SPACES.as_ref() {
        s = re.replace_all(&s, " ").into_owned();
    }
    cut_command_paths(s).trim().to_string()
}

/// Paths that name the same file put plainly: `/proc/self/root/x` as `/x`, `/.` as `/`,
/// `~` as the home directory (`cd ~/..` is `cd /home`), the one-character bracket of `r[m]` or
/// `/et[c]` as that character, a command name globbed (`/usr/bin/r?`) as the command it
/// matches; then vibeos-exec's own home and config file named as the variables the config
/// write pattern knows (`$vibeos_home`, `$vibeos_config`), however they are spelled (`own`:
/// [`own_paths`], resolved once per command).
fn same_files(primary: &str, own: &[(String, &str)]) -> String {
    let mut s = primary.to_string();
    if let Some(re) = PROC_ROOT.as_ref() {
        s = re
            .replace_all(&s, |c: &regex::Captures| {
                let after = &c[2];
                if after == "/" {
                    format!("{}/", &c[1])
                } else {
                    format!("{}/{after}", &c[1])
                }
            })
            .into_owned();
    }
    if let Some(re) = TRAILING_DOT.as_ref() {
        s = re.replace_all(&s, "$1$2").into_owned();
    }
    if let Some(home) = home_as_viewed() {
        if let Some(re) = TILDE.as_ref() {
            s = re
                .replace_all(&s, |c: &regex::Captures| {
                    format!("{}{home}{}", &c[1], &c[2])
                })
                .into_owned();
        }
    }
    if let Some(re) = ONE_CHAR_CLASS.as_ref() {
        s = re.replace_all(&s, "$1").into_owned();
    }
    s = globbed_commands(&s);
    if let Some(re) = SLASHES.as_ref() {
        s = re.replace_all(&s, "$1/").into_owned();
    }
    s = resolve_dot_dot(s);
    for (path, variable) in own {
        s = replace_path(&s, path, variable);
    }
    s
}

/// The command a globbed name matches ([`GLOBBED_COMMANDS`]), if its glob has a letter of its
/// own (`*` alone names anything).
fn command_matching(glob: &str) -> Option<&'static str> {
    if !glob.chars().any(|ch| !"*?[]".contains(ch)) {
        return None;
    }
    let glob = globset::Glob::new(glob).ok()?.compile_matcher();
    GLOBBED_COMMANDS
        .iter()
        .copied()
        .find(|cmd| glob.is_match(cmd))
}

/// Globbed command names put as the command they match: a word in command position
/// (`r? -rf x`), and a path whose last component is a glob wherever it stands (`env
/// /usr/bin/r? …`, `find … -exec /bin/r? …`, `xargs /usr/bin/k?ll`), since wrappers and
/// `-exec` run it as a command too.
fn globbed_commands(s: &str) -> String {
    let mut s = s.to_string();
    if let Some(re) = COMMAND_GLOB.as_ref() {
        s = re
            .replace_all(&s, |c: &regex::Captures| {
                let word = &c[2];
                let name = word.rsplit('/').next().unwrap_or(word);
                match command_matching(name) {
                    Some(cmd) => format!("{}{cmd}{}", &c[1], &c[3]),
                    None => c[0].to_string(),
                }
            })
            .into_owned();
    }
    if let Some(re) = GLOBBED_PATH.as_ref() {
        s = re
            .replace_all(&s, |c: &regex::Captures| match command_matching(&c[3]) {
                Some(cmd) => format!("{}{}{cmd}{}", &c[1], &c[2], &c[4]),
                None => c[0].to_string(),
            })
            .into_owned();
    }
    s
}

/// A command that writes, moves, links or removes something (what the config-write pattern
/// looks for in front of a path), in a view.
static WRITES: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r"(?:>|\btee\b|\bsed\s+(?:\S+\s+)*?-[a-z]*i|\bperl\s+(?:\S+\s+)*?-[a-z]*i|\b(?:cp|mv|ln|install|rm|truncate|mkdir|touch|dd|rsync|unlink|chmod|chown)\b)",
    )
    .ok()
});

/// Whether `command`, started in `dir`, writes and names vibeos-exec's home (its config,
/// plugins, logs) or its config file by a path the text does not spell as such: relative
/// (`../home/config.yaml`, `cd ../home && … >> config.yaml`), through a symlink, `/proc/self/cwd`
/// or `$PWD`. Each word is resolved from `dir` through the filesystem, as the shell would find
/// it. Words holding other variables or globs are not guessed.
pub(crate) fn writes_own_files(command: &str, views: &[String], dir: &std::path::Path) -> bool {
    let Some(writes) = WRITES.as_ref() else {
        return false;
    };
    if !views.iter().any(|v| writes.is_match(v)) {
        return false;
    }
    let targets: Vec<std::path::PathBuf> = [
        crate::settings::vibeos_home(),
        crate::settings::config_path(),
    ]
    .into_iter()
    .map(|p| crate::path_policy::real_as_far_as_it_exists(&dir.join(p)))
    .filter(|p| p.parent().is_some())
    .collect();
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    command
        .split(|c: char| c.is_whitespace() || ";&|<>()'\"=`".contains(c))
        .filter(|w| !w.is_empty())
        .take(256)
        .filter_map(|word| {
            let mut word = word.to_string();
            for var in ["${PWD}", "$PWD", "~+"] {
                if let Some(rest) = word.strip_prefix(var) {
                    word = format!("{}{rest}", dir.display());
                }
            }
            if let (Some(rest), Some(h)) = (word.strip_prefix('~'), &home) {
                if rest.is_empty() || rest.starts_with('/') {
                    word = format!("{}{rest}", h.display());
                }
            }
            (!word.contains(['$', '*', '?', '[']))
                .then(|| crate::path_policy::real_as_far_as_it_exists(&dir.join(word)))
        })
        .any(|p| targets.iter().any(|t| p.starts_with(t)))
}

/// vibeos-exec's home and config file as the views spell them (lower case), each also through
/// its symlinks, longest first, with the variable that names it.
fn own_paths() -> Vec<(String, &'static str)> {
    let mut paths = Vec::new();
    for (path, variable) in [
        (crate::settings::config_path(), "$vibeos_config"),
        (crate::settings::vibeos_home(), "$vibeos_home"),
    ] {
        let real = std::fs::canonicalize(&path).ok();
        for p in std::iter::once(path).chain(real) {
            let text = p.to_string_lossy().trim_end_matches('/').to_lowercase();
            // `/` or an empty path would name everything.
            if text.len() > 1 && !paths.iter().any(|(t, _)| t == &text) {
                paths.push((text, variable));
            }
        }
    }
    paths.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
    paths
}

/// `s` with `path` replaced by `variable` where it is a whole path or a path's start (followed
/// by `/`, a separator or the end; not `…/homework` for `…/home`).
fn replace_path(s: &str, path: &str, variable: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(path) {
        let end = i + path.len();
        let whole = rest[end..]
            .chars()
            .next()
            .is_none_or(|c| c == '/' || c.is_whitespace() || ";&|)`'\"".contains(c));
        out.push_str(&rest[..i]);
        out.push_str(if whole { variable } else { path });
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// An absolute path's `..` components resolved by name ([`without_dot_dot`]) throughout `s`.
fn resolve_dot_dot(mut s: String) -> String {
    if let Some(re) = DOT_DOT_PATH.as_ref() {
        // Twice, because a match consumes the separator the next path needs.
        for _ in 0..2 {
            s = re
                .replace_all(&s, |c: &regex::Captures<'_>| {
                    format!("{}{}{}", &c[1], without_dot_dot(&c[2]), &c[3])
                })
                .into_owned();
        }
    }
    s
}

/// The long options the patterns name, which GNU tools (and git) also take abbreviated to any
/// unambiguous prefix: `rm --r`, `chmod --recur`, `git reset --har`, `git clean --forc`.
const ABBREVIATED_LONG_OPTIONS: [&str; 6] = [
    "recursive",
    "force",
    "hard",
    "delete",
    "mirror",
    "no-preserve-root",
];

/// A long option written as a prefix of exactly one of [`ABBREVIATED_LONG_OPTIONS`], in full.
fn long_option_in_full(word: &str) -> Option<String> {
    let rest = word.strip_prefix("--")?;
    let (name, value) = rest.split_at(rest.find('=').unwrap_or(rest.len()));
    if name.is_empty() {
        return None;
    }
    let mut full = ABBREVIATED_LONG_OPTIONS
        .iter()
        .filter(|o| o.starts_with(name) && o.len() > name.len());
    match (full.next(), full.next()) {
        (Some(o), None) => Some(format!("--{o}{value}")),
        _ => None,
    }
}

/// One word with its brace list and a top-level glob expanded (`-{r,f}` → `-r -f`,
/// `/{etc,usr}` → `/etc /usr`, `/e*` → `/etc`, `/e?c/hosts` → `/etc/hosts`) and an abbreviated long option in full
/// ([`long_option_in_full`]); other words unchanged.
fn expand_word(word: &str) -> String {
    let (core, tail) = word.split_at(word.trim_end_matches([';', '&', '|', ')']).len());
    if let Some(full) = long_option_in_full(core) {
        return format!("{full}{tail}");
    }
    let mut words = vec![core.to_string()];
    if let Some(c) = BRACE_LIST.as_ref().and_then(|re| re.captures(core)) {
        if !c[1].ends_with('$') {
            words = c[2]
                .split(',')
                .map(|alt| format!("{}{alt}{}", &c[1], &c[3]))
                .collect();
        }
    }
    let words: Vec<String> = words
        .into_iter()
        .flat_map(|w| {
            let Some(c) = ROOT_GLOB.as_ref().and_then(|re| re.captures(&w)) else {
                return vec![w];
            };
            let Ok(glob) = globset::Glob::new(&c[2]).map(|g| g.compile_matcher()) else {
                return vec![w];
            };
            let hits: Vec<String> = TOP_LEVEL
                .iter()
                .filter(|d| glob.is_match(d))
                .map(|d| format!("/{d}{}", c.get(3).map_or("", |m| m.as_str())))
                .collect();
            if hits.is_empty() {
                vec![w]
            } else {
                hits
            }
        })
        .collect();
    format!("{}{tail}", words.join(" "))
}

/// A glob of `command_allowlist` or `approvals.deny` as a regex over a normalised command:
/// `*` and `?` never cross a command separator (`;`, `&`, `|`) — nor, with `nested: false`, a
/// subshell or substitution (`(`, `)`, a backtick) — so a glob describes one command; `[…]`
/// is a class and `{a,b}` a choice. The glob is normalised like a command first (lower case,
/// quotes removed).
pub fn glob_regex(glob: &str, nested: bool) -> String {
    let star = if nested { "[^;&|]" } else { "[^;&|()`]" };
    let g = normalize_command(glob);
    let mut out = String::new();
    let mut chars = g.chars().peekable();
    let mut depth = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                out.push_str(star);
                out.push('*');
            }
            '?' => out.push_str(star),
            '[' => {
                let mut class = String::from("[");
                let mut closed = false;
                if chars.peek() == Some(&'!') {
                    chars.next();
                    class.push('^');
                }
                for d in chars.by_ref() {
                    if d == ']' {
                        closed = true;
                        break;
                    }
                    if d == '\\' || d == '[' {
                        class.push('\\');
                    }
                    class.push(d);
                }
                if closed && class.len() > 1 {
                    out.push_str(&class);
                    out.push(']');
                } else {
                    out.push_str(&regex::escape(&class));
                }
            }
            '{' => {
                depth += 1;
                out.push_str("(?:");
            }
            ',' if depth > 0 => out.push('|'),
            '}' if depth > 0 => {
                depth -= 1;
                out.push(')');
            }
            ' ' => out.push_str(r"\s+"),
            c => out.push_str(&regex::escape(&c.to_string())),
        }
    }
    for _ in 0..depth {
        out.push(')');
    }
    out
}

/// Where one command of a normalised line may start: the beginning, or after a separator
/// (`;`, `&&`, `||`, `|`, `&`), a subshell or group opening, a substitution, a keyword that
/// runs the command after it (`then`, `do`, `else`, `if`, `while`, `!`, `time`, …); and
/// after the variable assignments in front of a command (`FOO=1 git push` runs `git push`).
pub const COMMAND_START: &str = r"(?:^|[;&|({`]|\b(?:then|do|else|elif|if|while|until|time)\s|!)\s*(?:[a-z_][a-z0-9_]*=\S*\s+)*";
/// Where one command of a normalised line ends.
pub const COMMAND_END: &str = r"\s*(?:$|[;&|)}`])";

/// What the user (or host) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalChoice {
    /// Run this command this time only.
    Once,
    /// Approve these patterns for the rest of the session.
    Session,
    /// Approve these patterns permanently (written to `command_allowlist`).
    Always,
    /// Do not run it.
    Deny,
}

/// What is being asked about.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// The command as given.
    pub command: String,
    /// Session/task id of the call, if any.
    pub task_id: Option<String>,
    /// Who asked to run it.
    pub origin: CallOrigin,
    /// `(key, description)` of every pattern that matched and is not yet approved.
    pub matches: Vec<(String, String)>,
    /// `command` is the source of a whole execute_code script (the whole-script guard), not a
    /// shell command.
    pub is_script: bool,
    /// The dir the command starts in, when known (a local terminal call's workdir or session
    /// dir; a remote call's absolute workdir): what its relative paths name.
    pub dir: Option<std::path::PathBuf>,
    /// Set when the execution whose call asks ends (its timeout, an interrupt, a client's
    /// cancel): a host still asking its user can withdraw the question then. Never set for a
    /// direct agent call.
    pub execution_ended: crate::call_scope::EndedFlag,
}

/// A host's approval prompt (a Rust host's; see [`ApprovalHost`] for one that can say why it
/// has no answer).
pub type ApprovalCallback = dyn Fn(&ApprovalRequest) -> ApprovalChoice + Send + Sync;

/// Why a host has no approval answer. Each counts as a denial, but none is the user's: the
/// refusal message names which it was, so "denied by the user" is only said when someone did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    /// The host's callback failed (a Python exception, a Rust panic).
    #[error("the approval callback failed: {0}")]
    CallbackFailed(String),
    /// The client answered the approval request with an error (an MCP JSON-RPC error, a
    /// closed connection).
    #[error("the client answered the approval request with an error: {0}")]
    ClientError(String),
    /// The request was dismissed without a decision (MCP `cancel`, a cancelled task).
    #[error("the approval request was cancelled without a decision{}", if .0.is_empty() { String::new() } else { format!(" ({})", .0) })]
    Cancelled(String),
    /// Nobody answered within `approvals.timeout`.
    #[error("nobody answered the approval request within {}s (approvals.timeout)", .0.as_secs_f64())]
    TimedOut(std::time::Duration),
    /// The terminal gave no input (end of input, or it could not be opened).
    #[error("no answer could be read from the terminal: {0}")]
    NoInput(String),
    /// A form or callback answered with something that is none of the choices it was offered.
    #[error("the answer to the approval request was {0}, not one of once, session, always, deny")]
    NotAChoice(String),
}

/// A host's answer: a choice, or why there is none.
pub type ApprovalAnswer = Result<ApprovalChoice, NoAnswer>;

/// A host's approval prompt that can report why it has no answer (the MCP and Python bridges).
pub type ApprovalHost = dyn Fn(&ApprovalRequest) -> ApprovalAnswer + Send + Sync;
/// A smart-approval check: `true` auto-approves (once) a low-risk match.
pub type SmartApproval = dyn Fn(&ApprovalRequest) -> bool + Send + Sync;

/// A smart-approval rule that auto-approves recursive deletes of well-known, regenerable build
/// and dependency directories (`rm -rf node_modules/`, `target`, `__pycache__`, …) and nothing
/// else. Install it with `set_smart_approval(Some(Arc::new(low_risk_cleanup)))`.
///
/// Each target must be a real directory (not a symlink) in the request's known start dir, or
/// not be there at all (removing it is then a no-op: an agent cleaning up twice, or before a
/// build, was denied): `rm -rf node_modules/` through a link `node_modules -> ../elsewhere`
/// deletes what the link points at. Names are compared as written (`Build` is not `build` on a
/// case-sensitive filesystem). Without a known dir nothing is approved here.
pub fn low_risk_cleanup(req: &ApprovalRequest) -> bool {
    const REGENERABLE: [&str; 10] = [
        "node_modules",
        "target",
        "__pycache__",
        ".pytest_cache",
        "dist",
        "build",
        ".venv",
        ".mypy_cache",
        ".tox",
        ".next",
    ];
    if req.matches.iter().any(|(k, _)| k != "recursive_delete") {
        return false;
    }
    let Some(dir) = req.dir.as_deref() else {
        return false;
    };
    // The normal form without lower-casing: quotes and backslashes gone, paths as written.
    let norm = finish(&join_lines(&req.command.replace("\\\n", " ")));
    if norm.contains([';', '&', '|', '`', '$', '>', '<', '*', '~', '\n']) {
        return false;
    }
    let mut words = norm.split(' ');
    if words.next() != Some("rm") {
        return false;
    }
    let targets: Vec<&str> = words.filter(|w| !w.starts_with('-')).collect();
    !targets.is_empty()
        && targets.iter().all(|t| {
            let t = t.trim_start_matches("./").trim_end_matches('/');
            REGENERABLE.contains(&t)
                && match std::fs::symlink_metadata(dir.join(t)) {
                    Ok(m) => m.is_dir(),
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_normalisation_regex_compiles() {
        // They are `Option`s so that a bad one cannot panic at run time; this keeps them real.
        for (name, re) in [
            ("IFS", &IFS),
            ("COMMAND_PATH", &COMMAND_PATH),
            ("SPACES", &SPACES),
            ("SLASHES", &SLASHES),
            ("DOT_DOT_PATH", &DOT_DOT_PATH),
            ("SQL_COMMENT", &SQL_COMMENT),
            ("ECHO_SUBST", &ECHO_SUBST),
            ("ASSIGNMENT", &ASSIGNMENT),
            ("VARIABLE", &VARIABLE),
            ("BRACE_LIST", &BRACE_LIST),
            ("ROOT_GLOB", &ROOT_GLOB),
            ("WRAPPER", &WRAPPER),
            ("SHELL_C", &SHELL_C),
        ] {
            assert!(re.is_some(), "{name} does not compile");
        }
    }

    #[test]
    fn dot_dot_in_an_absolute_path_is_resolved_by_name() {
        for (given, read) in [
            ("rm -rf /tmp/../*", "rm -rf /*"),
            ("rm -rf /var/../usr", "rm -rf /usr"),
            ("cd /tmp/.. && rm -rf *", "cd / && rm -rf *"),
            ("rm -rf /a/b/../../etc/", "rm -rf /etc/"),
            ("rm -rf /..", "rm -rf /"),
            ("rm -rf /a/.. /b/../etc", "rm -rf / /etc"),
            ("x=/srv/../etc; ls", "x=/etc; ls"),
            ("echo >/tmp/../etc/hosts", "echo >/etc/hosts"),
            // Relative paths and names that only contain dots stay.
            ("rm -rf ../build", "rm -rf ../build"),
            ("ls /srv/..data", "ls /srv/..data"),
            ("curl http://h/a/../b", "curl http://h/a/../b"),
        ] {
            assert_eq!(normalize_command(given), read, "{given}");
        }
    }

    #[test]
    fn globs_describe_one_command() {
        let re = |g: &str| Regex::new(&format!("^{}$", glob_regex(g, false))).unwrap();
        assert!(re("git push *").is_match("git push origin main"));
        assert!(!re("git push *").is_match("git push x; rm -rf y"));
        assert!(!re("git push *").is_match("git push $(rm -rf y)"));
        assert!(re("git {push,pull} *").is_match("git pull origin"));
        assert!(re("rm -rf [bd]uild").is_match("rm -rf build"));
        assert!(re("RM  -RF 'build'").is_match("rm -rf build"));
    }
}
