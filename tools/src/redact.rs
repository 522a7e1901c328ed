//! Redaction of credentials from what a script or command prints (SPEC §8,
//! `security.redact_output`, default on).
//!
//! Output of execute_code and of `terminal` goes back to the model, and from there into logs,
//! transcripts and other tools. Two things are replaced by a marker (`[REDACTED:<what>]`):
//! - the values of secret environment variables of this process — names the environment policy
//!   marks as secret (`deny_substrings`) or as managed credentials (`provider_blocklist`), the
//!   variables the scrubber removes for being secret. A value is matched without surrounding
//!   whitespace and one pair of surrounding quotes (a Kubernetes secret read `--from-file`
//!   ends in a newline, a docker `--env-file` keeps quotes), and only when that is
//!   `min_env_value_chars` or more, so a `DEBUG_TOKEN=1` does not turn every `1` into a marker.
//!   Values of variables dropped merely for not being allowlisted (`PWD`, `DISPLAY`, …) are not
//!   secrets and stay: redacting them would garble ordinary paths in the output. Neither are
//!   the `not_secret_names` of the policy (`GIT_AUTHOR_NAME`, `SSH_AUTH_SOCK`, …, which the
//!   scrubber still drops for their names) nor switch words such as `enabled`
//!   (`not_secret_values`);
//! - well-known credential formats (cloud keys, GitHub/Slack/OpenAI-style tokens, JWTs, PEM
//!   private key blocks, …), data in `policies/redact_patterns.json`.
//!
//! This is a safety net, not a boundary: a script that encodes a secret (base64, reversed,
//! split over lines) gets it out. The boundary is the environment scrubbing of SPEC §4.

use crate::policy_file::{self, PolicyFileError};
use crate::secret_shape::looks_like_token;
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use std::sync::LazyLock;

const PATTERNS_JSON: &str = include_str!("../../policies/redact_patterns.json");
const ENV_JSON: &str = include_str!("../../policies/env.json");

#[derive(Deserialize)]
struct PatternFile {
    marker: String,
    min_env_value_chars: usize,
    /// Missing means none: every secret-looking name is redacted (the safe side).
    #[serde(default)]
    not_secret_names: Vec<String>,
    #[serde(default)]
    not_secret_values: Vec<String>,
    /// Names whose values are redacted although the scrubber drops them for another reason
    /// (not allowlisted): password variables of common tools without a deny substring.
    #[serde(default)]
    secret_name_hints: Vec<String>,
    patterns: Vec<PatternData>,
}

#[derive(Deserialize)]
struct PatternData {
    name: String,
    regex: String,
    #[serde(default)]
    token_shaped: bool,
    #[serde(default)]
    requires: Option<String>,
}

/// One compiled credential format.
struct Format {
    name: String,
    re: Regex,
    /// A match counts only if what it would replace looks like a random token
    /// ([`looks_like_token`]); set for prefixes like `sk-` that ordinary names also start with.
    token_shaped: bool,
    /// Text every match contains: output without it is not searched. The regex engine finds
    /// no literal to skip ahead to in the private key pattern (its END-only alternative starts
    /// with any base64 line), and scanning 50 KB for it took 80 µs where this check takes 1.
    requires: Option<String>,
}

#[derive(Deserialize)]
struct EnvNames {
    deny_substrings: Vec<String>,
    provider_blocklist: Vec<String>,
}

struct Patterns {
    marker: String,
    min_env_value_chars: usize,
    formats: Vec<Format>,
    deny_substrings: Vec<String>,
    provider_blocklist: Vec<String>,
    not_secret_names: Vec<String>,
    not_secret_values: Vec<String>,
    /// `secret_name_hints` as one case-insensitive matcher (`None`: none given).
    secret_name_hints: Option<Regex>,
}

/// Where the redaction patterns come from, as named in errors.
pub const REDACT_PATTERNS_FILE: &str = "policies/redact_patterns.json";
/// Where the secret-name rules come from, as named in errors.
pub const ENV_POLICY_FILE: &str = "policies/env.json";

/// Compiles the redaction policy. A pattern that does not compile, or a file that does not
/// parse, is an error naming it: the list of credential formats is never silently shorter.
fn compile_patterns(redact_json: &str, env_json: &str) -> Result<Patterns, PolicyFileError> {
    let file: PatternFile = policy_file::parse(redact_json, REDACT_PATTERNS_FILE)?;
    let env: EnvNames = policy_file::parse(env_json, ENV_POLICY_FILE)?;
    let formats = file
        .patterns
        .into_iter()
        .map(|p| {
            let re = policy_file::compile(
                RegexBuilder::new(&p.regex).size_limit(1 << 22),
                REDACT_PATTERNS_FILE,
                &p.name,
                "regex",
            )?;
            Ok(Format {
                name: p.name,
                re,
                token_shaped: p.token_shaped,
                requires: p.requires,
            })
        })
        .collect::<Result<Vec<_>, PolicyFileError>>()?;
    let secret_name_hints = (!file.secret_name_hints.is_empty())
        .then(|| {
            policy_file::compile(
                RegexBuilder::new(&file.secret_name_hints.join("|")).case_insensitive(true),
                REDACT_PATTERNS_FILE,
                "secret_name_hints",
                "regex",
            )
        })
        .transpose()?;
    Ok(Patterns {
        marker: file.marker,
        min_env_value_chars: file.min_env_value_chars,
        formats,
        deny_substrings: env
            .deny_substrings
            .iter()
            .map(|s| s.to_ascii_uppercase())
            .collect(),
        provider_blocklist: env.provider_blocklist,
        not_secret_names: file.not_secret_names,
        not_secret_values: file.not_secret_values,
        secret_name_hints,
    })
}

static PATTERNS: LazyLock<Result<Patterns, PolicyFileError>> =
    LazyLock::new(|| compile_patterns(PATTERNS_JSON, ENV_JSON));

fn patterns() -> Result<&'static Patterns, &'static PolicyFileError> {
    PATTERNS.as_ref()
}

/// Starts compiling the redaction patterns on a thread of their own, once per process, when
/// redaction is on. Compiling them takes about 2 ms, and a cold `run` used to pay it after the
/// script's exit, on the way to its result; the supervisor calls this when a script first
/// prints, so the compilation overlaps the rest of the script. What is redacted, and how, does
/// not change: the first redaction waits for the same `LazyLock` if the thread has not
/// finished (or could not be started).
pub fn prepare_in_background() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    if STARTED.is_completed() || !enabled() {
        return;
    }
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("vibeos-redact-prep".to_owned())
            .spawn(|| {
                let _ = patterns();
            });
        if let Err(e) = spawned {
            tracing::debug!("redaction patterns compile on first use instead: {e}");
        }
    });
}

/// The forms a secret value takes when a script prints it escaped, besides as it is: inside
/// JSON (`json.dumps`) and inside a Python `repr` (printing a dict or a list shows its strings
/// so). A value holding a quote, a backslash or a control character is spelled otherwise
/// there, and a value `p@ss"w\rd` printed in a dict went out whole. Only the forms that differ
/// from the value are returned.
fn escaped_forms(value: &str) -> Vec<String> {
    let mut forms = Vec::new();
    if let Ok(json) = serde_json::to_string(value) {
        forms.push(json[1..json.len() - 1].to_string());
    }
    let mut repr = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => repr.push_str("\\\\"),
            '\n' => repr.push_str("\\n"),
            '\r' => repr.push_str("\\r"),
            '\t' => repr.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                repr.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => repr.push(c),
        }
    }
    // A value holding both quotes is shown in single quotes, its own escaped.
    if value.contains('\'') && value.contains('"') {
        forms.push(repr.replace('\'', "\\'"));
    }
    forms.push(repr);
    forms.retain(|f| f != value);
    forms.sort();
    forms.dedup();
    forms
}

/// Whether `security.redact_output` is on (the default; only an explicit `false` turns it off).
pub fn enabled() -> bool {
    crate::settings::redact_output()
}

/// Whether the variable `name` holds a secret by the environment policy.
pub fn is_secret_name(name: &str) -> bool {
    // Fail closed: with no policy to tell, every name counts as secret.
    patterns().map_or(true, |p| p.is_secret_name(name))
}

impl Patterns {
    /// Whether the environment policy counts `name` as secret (what the scrubber drops).
    fn is_secret_name(&self, name: &str) -> bool {
        let upper = name.to_ascii_uppercase();
        self.is_managed(name)
            || self
                .deny_substrings
                .iter()
                .any(|s| upper.contains(s.as_str()))
    }

    /// Whether `name` is a credential the product manages (`provider_blocklist`).
    fn is_managed(&self, name: &str) -> bool {
        self.provider_blocklist
            .iter()
            .any(|b| b.eq_ignore_ascii_case(name))
    }

    /// Whether output must not show the value of the variable `name`: a secret name that is
    /// not one of the `not_secret_names` (`GIT_AUTHOR_NAME` holds no credential, its `AUTH` is
    /// a coincidence). A managed credential is never exempt, whatever the list says.
    fn redacts_value_of(&self, name: &str) -> bool {
        let hinted = self
            .secret_name_hints
            .as_ref()
            .is_some_and(|h| h.is_match(name));
        (self.is_secret_name(name) || hinted)
            && (self.is_managed(name) || !self.not_secret_names.iter().any(|n| n == name))
    }

    /// The part of a secret variable's `value` to look for in output, if any: the value
    /// without surrounding whitespace and one pair of surrounding quotes, which a file-mounted
    /// secret (trailing newline) or a docker `--env-file` (literal quotes) adds and which
    /// output of the secret need not repeat. `None` when what is left is shorter than
    /// `min_env_value_chars` or a switch word of `not_secret_values`: a value like `1` or
    /// `enabled` is everywhere in ordinary output and secret nowhere.
    fn secret_form<'v>(&self, value: &'v str) -> Option<&'v str> {
        let trimmed = value.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| trimmed.strip_prefix(*q)?.strip_suffix(*q))
            .map_or(trimmed, str::trim);
        let long_enough = |v: &str| v.chars().count() >= self.min_env_value_chars;
        // A short value in quotes is still looked for with its quotes, as before quotes were
        // stripped: `"abcd"` is six characters of output.
        let form = [unquoted, trimmed].into_iter().find(|v| long_enough(v))?;
        let switch_word = self
            .not_secret_values
            .iter()
            .any(|w| w.eq_ignore_ascii_case(unquoted));
        (!switch_word).then_some(form)
    }
}

/// Replaces secrets in text. Build one per execution or command; applying it is one pass per
/// pattern.
pub struct Redactor {
    /// The compiled policy, or why it is broken (then all output is withheld).
    policy: Result<&'static Patterns, &'static PolicyFileError>,
    /// Secret values (longest first) with the variable name each came from.
    env_values: Option<(Regex, Vec<(String, String)>)>,
}

impl Redactor {
    /// A redactor for the secret variables among `env` (name, value pairs; see the module docs
    /// for which count).
    pub fn from_env<I, K, V>(env: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        Self::with_policy(patterns(), env)
    }

    fn with_policy<I, K, V>(
        policy: Result<&'static Patterns, &'static PolicyFileError>,
        env: I,
    ) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let Ok(p) = policy else {
            return Redactor {
                policy,
                env_values: None,
            };
        };
        let mut values: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| p.redacts_value_of(k.as_ref()))
            .filter_map(|(k, v)| {
                let form = p.secret_form(v.as_ref())?;
                Some((form.to_string(), k.as_ref().to_string()))
            })
            .flat_map(|(form, name)| {
                escaped_forms(&form)
                    .into_iter()
                    .map(|e| (e, name.clone()))
                    .chain(std::iter::once((form, name.clone())))
                    .collect::<Vec<_>>()
            })
            .collect();
        values.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.1.cmp(&b.1)));
        values.dedup_by(|a, b| a.0 == b.0);
        let env_values = (!values.is_empty())
            .then(|| {
                let alternation: Vec<String> =
                    values.iter().map(|(v, _)| regex::escape(v)).collect();
                RegexBuilder::new(&alternation.join("|"))
                    .size_limit(1 << 26)
                    .build()
                    .map_err(|e| tracing::warn!("cannot build the secret-value matcher: {e}"))
                    .ok()
            })
            .flatten()
            .map(|re| (re, values));
        Redactor { policy, env_values }
    }

    /// A redactor for the secret variables of this process's environment.
    pub fn for_process() -> Self {
        Self::from_env(lossy_env(std::env::vars_os()))
    }

    /// `text` with every secret replaced by a marker, and how many were replaced. With a broken
    /// redaction policy nothing can be told apart, so the whole text is withheld (fail closed).
    pub fn redact(&self, text: &str) -> (String, usize) {
        let p = match self.policy {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{e}");
                return (
                    format!("[output withheld: the redaction policy is broken: {e}]"),
                    1,
                );
            }
        };
        let mut count = 0;
        let mut out = text.to_string();
        if let Some((re, values)) = &self.env_values {
            if re.is_match(&out) {
                out = re
                    .replace_all(&out, |c: &regex::Captures<'_>| {
                        count += 1;
                        let name = values
                            .iter()
                            .find(|(v, _)| v == &c[0])
                            .map(|(_, n)| n.as_str())
                            .unwrap_or("secret");
                        p.marker.replace("{name}", name)
                    })
                    .into_owned();
            }
            if let Some(cut) = redact_cut_values(&out, values, &p.marker, &mut count) {
                out = cut;
            }
        }
        for f in &p.formats {
            let lacks_literal = f.requires.as_deref().is_some_and(|lit| !out.contains(lit));
            if lacks_literal || !f.re.is_match(&out) {
                continue;
            }
            let marker = p.marker.replace("{name}", &f.name);
            out =
                f.re.replace_all(&out, |c: &regex::Captures<'_>| {
                    // Group 0 is the whole match, always present.
                    let Some(m) = c.get(0) else {
                        return String::new();
                    };
                    let whole = m.as_str();
                    // Only the `secret` group is replaced when the pattern has one.
                    let secret = c.name("secret").unwrap_or(m);
                    if f.token_shaped && !looks_like_token(secret.as_str()) {
                        return whole.to_string();
                    }
                    count += 1;
                    let (start, end) = (secret.start() - m.start(), secret.end() - m.start());
                    format!("{}{marker}{}", &whole[..start], &whole[end..])
                })
                .into_owned();
        }
        (out, count)
    }
}

/// The most truncation markers [`redact_cut_values`] looks beside (stdout's and stderr's, and
/// room for a result that holds both twice).
const MAX_CUTS: usize = 8;

/// The shortest piece of a secret value a cut's leftover is replaced for: a shorter one tells
/// little, and a few letters next to a cut match the start of some value by chance.
const MIN_CUT_PIECE: usize = 4;

/// `text` with what an output cap's cut left of a secret value replaced: the end of the text
/// before a truncation marker when it is the start of a value, and the start of the text after
/// one when it is the end of a value. A whole value is matched above; a cut that split one
/// left two pieces no match finds — the capture drops the word it split, but a value with
/// spaces (a passphrase) spans several words, and one inside a run of token characters longer
/// than any credential stays. `None` when no piece was found.
fn redact_cut_values(
    text: &str,
    values: &[(String, String)],
    marker: &str,
    count: &mut usize,
) -> Option<String> {
    // A real result has one cut per stream; a script can print look-alike markers, each of
    // which costs a comparison per value and length, so only the first few are looked at.
    let cuts: Vec<(usize, usize)> = crate::capture::CUT_MARKER
        .as_ref()?
        .find_iter(text)
        .take(MAX_CUTS)
        .map(|m| (m.start(), m.end()))
        .collect();
    if cuts.is_empty() {
        return None;
    }
    // Byte ranges of `text` to replace, with the variable each piece belongs to.
    let mut pieces: Vec<(usize, usize, &str)> = Vec::new();
    let mut kept_from = 0;
    for (i, &(start, end)) in cuts.iter().enumerate() {
        let before = &text[kept_from..start];
        let after = &text[end..cuts.get(i + 1).map_or(text.len(), |c| c.0)];
        let longest = |piece_of: &dyn Fn(&str, usize) -> Option<usize>| {
            values
                .iter()
                .filter_map(|(v, name)| Some((piece_of(v, v.len().checked_sub(1)?)?, name)))
                .max_by_key(|(len, _)| *len)
        };
        // The longest start of a value `before` ends with.
        let head = longest(&|v, most| {
            (MIN_CUT_PIECE..=most)
                .rev()
                .find(|k| v.is_char_boundary(*k) && before.ends_with(&v[..*k]))
        });
        if let Some((len, name)) = head {
            pieces.push((start - len, start, name.as_str()));
        }
        // The longest end of a value `after` starts with.
        let tail = longest(&|v, most| {
            (MIN_CUT_PIECE..=most)
                .rev()
                .find(|k| v.is_char_boundary(v.len() - k) && after.starts_with(&v[v.len() - k..]))
        });
        if let Some((len, name)) = tail {
            pieces.push((end, end + len, name.as_str()));
        }
        kept_from = end;
    }
    if pieces.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end, name) in pieces {
        out.push_str(&text[at..start.max(at)]);
        out.push_str(&marker.replace("{name}", name));
        at = end.max(at);
        *count += 1;
    }
    out.push_str(&text[at..]);
    Some(out)
}

/// Environment pairs as text for [`Redactor::from_env`]: a value that is not UTF-8 in its
/// lossy form (U+FFFD for each bad byte), which is how it reads in output decoded the same
/// way; skipping such a value let a script print it through `sys.stdout.buffer`.
pub fn lossy_env(
    env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> impl Iterator<Item = (String, String)> {
    env.into_iter().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    })
}

/// `text` printed by a command of the call `ctx`, redacted when `security.redact_output` is on
/// (the secrets of this process's environment and of the command's own), with the count.
pub fn redact_command_output(text: String, ctx: &crate::ToolContext) -> (String, usize) {
    if !enabled() {
        return (text, 0);
    }
    let own = lossy_env(std::env::vars_os());
    let given = ctx.env.iter().flat_map(|e| e.iter().cloned());
    Redactor::from_env(own.chain(given)).redact(&text)
}

/// A terminal or process result that a backend's tool agent sent back, redacted here as well:
/// the agent runs over there with that side's environment and settings, so neither this host's
/// scrubbed values (its credentials for the service included) nor its `security.redact_output`
/// reach it. The agent's own count is kept and this host's added to it.
pub fn redact_forwarded(
    result: Result<serde_json::Value, crate::ToolError>,
    ctx: &crate::ToolContext,
) -> Result<serde_json::Value, crate::ToolError> {
    let mut value = result?;
    if let Some(obj) = value.as_object_mut() {
        if let Some(serde_json::Value::String(text)) = obj.get_mut("output") {
            let (redacted, count) = redact_command_output(std::mem::take(text), ctx);
            *text = redacted;
            if count > 0 || obj.contains_key("redactions") {
                let before = obj
                    .get("redactions")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                obj.insert("redactions".into(), (before + count as u64).into());
            }
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formats(text: &str) -> (String, usize) {
        Redactor::from_env(Vec::<(String, String)>::new()).redact(text)
    }

    #[test]
    fn every_pattern_compiles() {
        let file: PatternFile =
            serde_json::from_str(PATTERNS_JSON).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(patterns().unwrap().formats.len(), file.patterns.len());
    }

    #[test]
    fn a_broken_redaction_policy_fails_closed() {
        let bad_regex = r#"{"marker": "[R:{name}]", "min_env_value_chars": 6,
            "patterns": [{"name": "fine", "regex": "x"}, {"name": "broken_one", "regex": "(a"}]}"#;
        let e = compile_patterns(bad_regex, ENV_JSON).err().unwrap();
        assert!(
            e.to_string().starts_with(
                "policies/redact_patterns.json: pattern `broken_one` (regex) does not compile"
            ),
            "{e}"
        );
        let e = compile_patterns("{", ENV_JSON).err().unwrap();
        assert!(
            e.to_string()
                .starts_with("policies/redact_patterns.json is not a valid"),
            "{e}"
        );
        let e = compile_patterns(PATTERNS_JSON, "[]").err().unwrap();
        assert!(
            e.to_string()
                .starts_with("policies/env.json is not a valid"),
            "{e}"
        );
        // A redactor over a broken policy withholds everything rather than pass secrets.
        let broken: &'static PolicyFileError = Box::leak(Box::new(e));
        let r = Redactor::with_policy(Err(broken), [("API_TOKEN", "supersecretvalue")]);
        let (out, n) = r.redact("the token is supersecretvalue and AKIAIOSFODNN7EXAMPLE");
        assert_eq!(n, 1);
        assert!(
            !out.contains("supersecretvalue") && !out.contains("AKIA"),
            "{out}"
        );
        assert!(out.contains("policies/env.json"), "{out}");
    }

    #[test]
    fn well_known_formats_are_replaced() {
        let cases = [
            ("key AKIAIOSFODNN7EXAMPLE here", "aws_access_key_id"),
            ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key"),
            ("token ghp_0123456789abcdefghijABCDEFGHIJ012345", "github_token"),
            ("xoxb-1234567890-abcdefghij", "slack_token"),
            ("OPENAI sk-proj-Ab3dEfGh1jKlMnOpQrStUvWx", "openai_key"),
            ("sk-ant-api03-Xq7vB2kLm9Tz4RwYp1Nc8Hd5Fg3Js6", "anthropic_key"),
            ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
            ("Authorization: Bearer abcdefghijklmnop1234", "bearer_token"),
            ("postgres://app:hunter2secret@db:5432/x", "url_password"),
            (r#"{"user": "bob", "password": "Tr0ub4dor&3xyz"}"#, "password_assignment"),
            ("DB_PASSWORD=s3cr3t-value", "password_assignment"),
            ("{'passwd': 'abcdef12'}", "password_assignment"),
            ("new_password: letmein99", "password_assignment"),
        ];
        for (text, name) in cases {
            let (out, n) = formats(text);
            assert!(
                n >= 1 && out.contains(&format!("[REDACTED:{name}]")),
                "{text:?} -> {out:?}"
            );
        }
        let (out, _) = formats("Authorization: Bearer abcdefghijklmnop1234");
        assert!(out.starts_with("Authorization: Bearer [REDACTED"), "{out}");
        // A Telegram bot token where it is usually seen: glued to `/bot` in the API's URL.
        let token = format!("123456789:AA{}", "Bc4De5Fg6Hi7Jk8Lm9No0Pq1Rs2Tu3Vw4");
        for (text, shown) in [
            (
                format!("https://api.telegram.org/bot{token}/sendMessage"),
                "https://api.telegram.org/bot[REDACTED:telegram_bot_token]/sendMessage",
            ),
            (format!("id {token}"), "id [REDACTED:telegram_bot_token]"),
        ] {
            assert_eq!(formats(&text), (shown.to_string(), 1), "{text}");
        }
        assert_eq!(formats(&format!("robot{token}")).1, 0);
        let pem =
            "a\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----\nb";
        let (out, n) = formats(pem);
        assert_eq!((out.as_str(), n), ("a\n[REDACTED:private_key]\nb", 1));
    }

    #[test]
    fn password_variables_without_a_deny_substring_are_redacted_too() {
        // Stop 50's probe: scrubbed (not allowlisted), yet printed as-is from a `.env` file.
        let env = [
            ("MYSQL_PWD", "mysql-pw-4815"),
            ("SSHPASS", "ssh-pw-162342"),
            ("BORG_PASSPHRASE", "correct horse battery"),
            ("REDIS_PASS", "redis-pw-0815"),
            ("OLDPWD", "/home/someone/project"),
            ("PWD", "/home/someone/project"),
        ];
        let r = Redactor::from_env(env);
        let (out, n) = r.redact(
            "mysql-pw-4815 ssh-pw-162342 correct horse battery redis-pw-0815 /home/someone/project",
        );
        assert_eq!(n, 4, "{out}");
        assert!(out.ends_with(" /home/someone/project"), "{out}");
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in [
            "hello world",
            "/home/user/project/src/main.rs:12",
            "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "https://example.com/path?q=1",
            "task-12345 done",
        ] {
            assert_eq!(formats(text), (text.to_string(), 0), "{text}");
        }
    }

    #[test]
    fn secret_env_values_are_replaced_but_short_and_non_secret_ones_are_not() {
        let r = Redactor::from_env([
            ("MY_DB_PASSWORD", "correct-horse-battery"),
            ("DEBUG_TOKEN", "1"),
            ("PWD", "/work/project"),
        ]);
        let (out, n) = r.redact("pw=correct-horse-battery in /work/project, 1 time");
        assert_eq!(n, 1);
        assert_eq!(out, "pw=[REDACTED:MY_DB_PASSWORD] in /work/project, 1 time");
    }

    #[test]
    fn json_and_dict_forms_of_credentials_are_replaced() {
        // Printing request headers or an STS response as a dict or JSON is the common way
        // these leak; the quote closing the key used to defeat `authorization\s*[:=]`.
        let bearer = "abcdefghijklmnopqrstuvwxyz012345";
        let aws_secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        let session = format!("FwoGZXIvYXdzEBYaDH{}", "Qx7Lm2Pz8Rt4Vb6N".repeat(8));
        let cases = [
            format!(r#"{{"Authorization": "Bearer {bearer}"}}"#),
            format!("{{'Authorization': 'Bearer {bearer}'}}"),
            format!("{{'headers': {{'Authorization': 'token {bearer}'}}}}"),
            format!(r#"{{"authorization":"Basic {bearer}"}}"#),
            format!(r#"{{b'Proxy-Authorization': b'Bearer {bearer}'}}"#),
            format!(r#"log: "{{\"Authorization\": \"Bearer {bearer}\"}}""#),
            format!(
                r#"{{"Credentials": {{"AccessKeyId": "ASIAIOSFODNN7EXAMPLE", "SecretAccessKey": "{aws_secret}", "SessionToken": "{session}"}}}}"#
            ),
            format!("{{'SecretAccessKey': '{aws_secret}'}}"),
            format!("aws_secret_access_key={aws_secret}"),
        ];
        for text in &cases {
            let (out, n) = formats(text);
            assert!(n >= 1, "{text} -> {out}");
            for secret in [bearer, aws_secret, &session, "ASIAIOSFODNN7EXAMPLE"] {
                assert!(!out.contains(secret), "{text} -> {out}");
            }
        }
        let (out, n) = formats(&cases[0]);
        assert_eq!(
            (out.as_str(), n),
            (r#"{"Authorization": "Bearer [REDACTED:bearer_token]"}"#, 1)
        );
        let (out, n) = formats(&cases[6]);
        assert_eq!(n, 3, "{out}");
        assert!(
            out.contains(r#""SecretAccessKey": "[REDACTED:aws_secret_access_key]""#)
                && out.contains(r#""SessionToken": "[REDACTED:aws_session_token]""#),
            "{out}"
        );
        // A secret key that ends in `/` or `+` has no word boundary before the closing quote.
        let slash_end = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKE/";
        let (out, n) = formats(&format!(r#"{{"SecretAccessKey": "{slash_end}"}}"#));
        assert_eq!(n, 1, "{out}");
        assert!(!out.contains(slash_end), "{out}");
    }

    #[test]
    fn a_private_key_cut_open_is_replaced_from_its_begin_line() {
        // read_file(key, limit=4) and `head -c 300 key` show the BEGIN line and the first
        // lines of the key, without the END line the whole-block pattern needed.
        let body = [
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAABlwAAAAdzc2gtcn",
            "NhAAAAAwEAAQAAAYEAu8Jk2Qx7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0WsQ9x7Lm2Pz8Rt4Vb6Nc",
            "1Kd5Fg3Hj0WsQ9x7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0WsQ9x7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0",
        ];
        let paged = format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n{}\n{}\n",
            body[0], body[1], body[2]
        );
        let headed = format!(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n{}",
            body[0],
            &body[1][..30]
        );
        for (text, before) in [
            (format!("key:\n{paged}"), "key:\n"),
            (format!("{headed}done"), ""),
        ] {
            let (out, n) = formats(&text);
            assert_eq!(
                (out.as_str(), n),
                (format!("{before}[REDACTED:private_key]").as_str(), 1),
                "{text}"
            );
        }
        // The end of a key without its BEGIN line (`tail`, a read from an offset): the key
        // lines before the END line go (full lines of 16 or more characters, and the last,
        // which may be short), the text before them stays, even a word.
        let tailed = format!(
            "lastlines\n{}\n{}\n-----END OPENSSH PRIVATE KEY-----\nafter\n",
            &body[1][20..],
            body[2]
        );
        let (out, n) = formats(&tailed);
        assert_eq!(
            (out.as_str(), n),
            ("lastlines\n[REDACTED:private_key]\nafter\n", 1),
            "{tailed}"
        );
        // The same through read_file's numbered lines (offset=5).
        let numbered = format!(
            "     5|{}\n     6|{}\n     7|-----END OPENSSH PRIVATE KEY-----\n",
            body[1], body[2]
        );
        let (out, n) = formats(&numbered);
        assert_eq!((out.as_str(), n), ("[REDACTED:private_key]\n", 1));
        // A whole block is replaced up to its END line; an open one after it to the end.
        let whole = format!(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\nbetween\n",
            body[0]
        );
        let (out, n) = formats(&format!("{whole}{paged}"));
        assert_eq!(
            (out.as_str(), n),
            ("[REDACTED:private_key]\nbetween\n[REDACTED:private_key]", 2)
        );
        // A public key is not a secret.
        let public = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n";
        assert_eq!(formats(public), (public.to_string(), 0));
    }

    #[test]
    fn env_values_are_found_without_surrounding_whitespace_and_quotes() {
        // A Kubernetes secret mounted from a file ends in a newline; a docker --env-file keeps
        // quotes. The value the output shows is the one inside.
        let text = "token is trailingsecret777 ok";
        for value in [
            "trailingsecret777",
            "trailingsecret777\n",
            "trailingsecret777\r\n",
            "\"trailingsecret777\"",
            "'trailingsecret777'",
            " trailingsecret777",
            " \"trailingsecret777\"\n",
        ] {
            let r = Redactor::from_env([("MY_API_TOKEN", value)]);
            assert_eq!(
                r.redact(text),
                ("token is [REDACTED:MY_API_TOKEN] ok".to_string(), 1),
                "{value:?}"
            );
        }
        // What is left inside the quotes must still be long enough to be a secret, and a short
        // quoted value is looked for with its quotes, as before.
        let r = Redactor::from_env([("MY_API_TOKEN", "\"abcd\"")]);
        assert_eq!(r.redact("x=abcd"), ("x=abcd".to_string(), 0));
        assert_eq!(
            r.redact("x=\"abcd\""),
            ("x=[REDACTED:MY_API_TOKEN]".to_string(), 1)
        );
        let r = Redactor::from_env([("MY_API_TOKEN", "  abc \n")]);
        assert_eq!(r.redact("abc"), ("abc".to_string(), 0));
    }

    #[test]
    fn a_secret_value_printed_escaped_is_redacted_too() {
        // Stop 59's probe: `print(json.dumps(v))` and `print({"k": v})` showed it whole.
        let value = "p@ss\"w\\rd/x+y";
        let r = Redactor::from_env([("MY_SECRET", value)]);
        for (text, shown) in [
            ("\"p@ss\\\"w\\\\rd/x+y\"", "\"[REDACTED:MY_SECRET]\""),
            (
                "{'k': 'p@ss\"w\\\\rd/x+y'}",
                "{'k': '[REDACTED:MY_SECRET]'}",
            ),
            ("p@ss\"w\\rd/x+y", "[REDACTED:MY_SECRET]"),
        ] {
            assert_eq!(r.redact(text), (shown.to_string(), 1), "{text}");
        }
        let r = Redactor::from_env([("MY_SECRET", "it's \"q\"\tz")]);
        assert_eq!(
            r.redact("['it\\'s \"q\"\\tz']"),
            ("['[REDACTED:MY_SECRET]']".to_string(), 1)
        );
    }

    #[test]
    fn non_credential_names_and_switch_words_keep_their_values() {
        let env = [
            ("GIT_AUTHOR_NAME", "Alice Example"),
            ("GIT_AUTHOR_EMAIL", "alice@example.com"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock"),
            ("KEYBOARD_LAYOUT", "us-intl"),
            ("TOKENIZERS_PARALLELISM", "enabled"),
            ("FEATURE_TOKEN_CHECK", "disabled"),
            ("MY_SERVICE_TOKEN", "real-secret-4711"),
        ];
        let text = "Author: Alice Example <alice@example.com>\nsocket /tmp/ssh-agent.sock, \
                    keyboard: us-intl, tokenizer: enabled, check: disabled, t=real-secret-4711";
        let (out, n) = Redactor::from_env(env).redact(text);
        assert_eq!(n, 1, "{out}");
        assert_eq!(
            out,
            text.replace("real-secret-4711", "[REDACTED:MY_SERVICE_TOKEN]")
        );
        // The scrubber still counts them as secret (SPEC §4 rule 2): only output keeps them.
        for (name, _) in env {
            assert!(is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn a_managed_credential_is_redacted_even_if_listed_as_not_secret() {
        let json = PATTERNS_JSON.replacen(
            "\"not_secret_names\": [",
            "\"not_secret_names\": [\"GITHUB_TOKEN\", \"MY_SERVICE_TOKEN\", ",
            1,
        );
        let policy: &'static Patterns =
            Box::leak(Box::new(compile_patterns(&json, ENV_JSON).unwrap()));
        let r = Redactor::with_policy(
            Ok(policy),
            [
                ("GITHUB_TOKEN", "managed-value-123"),
                ("MY_SERVICE_TOKEN", "listed-value-456"),
            ],
        );
        assert_eq!(
            r.redact("managed-value-123 listed-value-456"),
            ("[REDACTED:GITHUB_TOKEN] listed-value-456".to_string(), 1)
        );
    }

    #[test]
    fn the_not_secret_lists_are_consistent_with_the_env_policy() {
        let p = patterns().unwrap();
        assert!(!p.not_secret_names.is_empty() && !p.not_secret_values.is_empty());
        for name in &p.not_secret_names {
            // An entry must be a name the scrubber drops (else it is dead data), and never a
            // credential the product manages.
            assert!(p.is_secret_name(name), "{name} is not secret anyway");
            assert!(!p.is_managed(name), "{name} is a managed credential");
        }
    }

    #[test]
    fn names_and_urls_that_only_look_like_formats_are_left_alone() {
        for text in [
            "visit http://localhost:8080?invite=alice@example.com",
            "http://example.com:80#section@anchor",
            "id=sk-payments-service-deployment-v2",
            "sk-ant-colony-simulation-project-notes",
            "use the sk-learn-compatible-estimator-wrapper",
            // Password-ish words that hold no password: a hash's name, the shell's PWD, a
            // short or empty value, an already redacted one, prose.
            "password_hash=abcdef123456",
            "PWD=/home/someone/project",
            "password=None",
            "password: [REDACTED:env]",
            "passwords are stored hashed",
            r#"{"password": ""}"#,
        ] {
            assert_eq!(formats(text), (text.to_string(), 0), "{text}");
        }
        // Only the value goes: the key stays readable.
        assert_eq!(
            formats(r#"{"user": "bob", "password": "Tr0ub4dor&3xyz"}"#).0,
            r#"{"user": "bob", "password": "[REDACTED:password_assignment]"}"#
        );
        // The real shapes still are.
        for (text, name) in [
            (
                "postgres://app:hunter2secret@db:5432/x?sslmode=require",
                "url_password",
            ),
            (
                "http://user:p4ss@localhost:8080?invite=alice@example.com",
                "url_password",
            ),
            (
                "sk-Q9x7Lm2Pz8Rt4Vb6Nc1Kd5Fg3Hj0WsQ9x7Lm2Pz8Rt4Vb6Nc1",
                "openai_key",
            ),
            (
                "sk-or-v1-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "openai_key",
            ),
            ("sk-3f9a1c7e5b2d4f6a8c0e1b3d5f7a9c2e", "openai_key"),
        ] {
            let (out, n) = formats(text);
            assert!(
                n == 1 && out.contains(&format!("[REDACTED:{name}]")),
                "{text} -> {out}"
            );
        }
        assert!(looks_like_token("proj-Ab3dEfGh1jKl"));
        assert!(!looks_like_token("payments-service-deployment-v2"));
        assert!(!looks_like_token("ABCDEFGHIJKLMNOP"));
    }

    #[test]
    fn what_a_cut_left_of_a_secret_value_is_replaced_on_both_sides() {
        use crate::capture::HeadTail;
        let r = Redactor::from_env([
            ("MY_SECRET_PHRASE", "correct horse battery staple"),
            ("MY_PASSWORD", "hunter2secretvalue"),
        ]);
        // A passphrase spans words: the capture drops only the word the cut split.
        let mut c = HeadTail::new(100);
        c.push(format!("{}pw: correct horse battery staple", "w ".repeat(13)).as_bytes());
        c.push(" more".repeat(40).as_bytes());
        let (out, n) = r.redact(&c.render("output"));
        assert!(!out.contains("correct horse"), "{out}");
        assert!(
            out.contains("pw: [REDACTED:MY_SECRET_PHRASE]\n\n... [output truncated"),
            "{out}"
        );
        assert_eq!(n, 1);
        // A value inside a run of token characters longer than any credential stays in the
        // capture: both of its pieces go here.
        let mut c = HeadTail::new(1_000);
        c.push(&vec![b'x'; 400 - 9]);
        c.push(b"hunter2secretvalue");
        c.push(&vec![b'y'; 5_000]);
        let mut c2 = HeadTail::new(1_000);
        c2.push("z ".repeat(2_000).as_bytes());
        c2.push(&vec![b'x'; 5_000]);
        c2.push(b"hunter2secretvalue");
        c2.push(&vec![b'y'; 591]);
        let text = format!("{}{}", c.render("output"), c2.render("stderr"));
        assert!(
            text.contains("hunter2se\n") && text.contains("\n\ncretvalue"),
            "{text}"
        );
        let (out, n) = r.redact(&text);
        assert!(
            !out.contains("hunter2se") && !out.contains("cretvalue"),
            "{out}"
        );
        assert_eq!(n, 2, "{out}");
        // Letters that merely end like a value are left alone away from a cut.
        let (out, n) = r.redact("the hunter2 went home");
        assert_eq!((out.as_str(), n), ("the hunter2 went home", 0));
    }
}
