//! Redaction of credentials from what a script or command prints (SPEC §8,
//! `security.redact_output`, default on).
//!
//! Output of execute_code and of `terminal` goes back to the model, and from there into logs,
//! transcripts and other tools. Two things are replaced by a marker (`[REDACTED:<what>]`):
//! - the values of secret environment variables of this process — names the environment policy
//!   marks as secret (`deny_substrings`) or as managed credentials (`provider_blocklist`), the
//!   variables the scrubber removes for being secret. Only values of
//!   `min_env_value_chars` or more, so a `DEBUG_TOKEN=1` does not turn every `1` into a marker.
//!   Values of variables dropped merely for not being allowlisted (`PWD`, `DISPLAY`, …) are not
//!   secrets and stay: redacting them would garble ordinary paths in the output;
//! - well-known credential formats (cloud keys, GitHub/Slack/OpenAI-style tokens, JWTs, PEM
//!   private key blocks, …), data in `policies/redact_patterns.json`.
//!
//! This is a safety net, not a boundary: a script that encodes a secret (base64, reversed,
//! split over lines) gets it out. The boundary is the environment scrubbing of SPEC §4.

use crate::policy_file::{self, PolicyFileError};
use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use std::sync::LazyLock;

const PATTERNS_JSON: &str = include_str!("../../policies/redact_patterns.json");
const ENV_JSON: &str = include_str!("../../policies/env.json");

#[derive(Deserialize)]
struct PatternFile {
    marker: String,
    min_env_value_chars: usize,
    patterns: Vec<PatternData>,
}

#[derive(Deserialize)]
struct PatternData {
    name: String,
    regex: String,
}

#[derive(Deserialize)]
struct EnvNames {
    deny_substrings: Vec<String>,
    provider_blocklist: Vec<String>,
}

struct Patterns {
    marker: String,
    min_env_value_chars: usize,
    formats: Vec<(String, Regex)>,
    deny_substrings: Vec<String>,
    provider_blocklist: Vec<String>,
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
            Ok((p.name, re))
        })
        .collect::<Result<Vec<_>, PolicyFileError>>()?;
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

/// Whether `security.redact_output` is on (the default; only an explicit `false` turns it off).
pub fn enabled() -> bool {
    crate::settings::current_or_default()
        .security
        .as_ref()
        .and_then(|s| s.redact_output)
        != Some(false)
}

/// Whether the variable `name` holds a secret by the environment policy.
pub fn is_secret_name(name: &str) -> bool {
    // Fail closed: with no policy to tell, every name counts as secret.
    let Ok(p) = patterns() else {
        return true;
    };
    let upper = name.to_ascii_uppercase();
    p.provider_blocklist
        .iter()
        .any(|b| b.eq_ignore_ascii_case(name))
        || p.deny_substrings.iter().any(|s| upper.contains(s.as_str()))
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
        let min = p.min_env_value_chars;
        let mut values: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, v)| is_secret_name(k.as_ref()) && v.as_ref().trim().chars().count() >= min)
            .map(|(k, v)| (v.as_ref().to_string(), k.as_ref().to_string()))
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
        Self::from_env(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
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
        }
        for (name, re) in &p.formats {
            if !re.is_match(&out) {
                continue;
            }
            let marker = p.marker.replace("{name}", name);
            out = re
                .replace_all(&out, |c: &regex::Captures<'_>| {
                    count += 1;
                    match c.name("secret") {
                        Some(secret) => {
                            let whole = c.get(0).map_or(0..0, |m| m.range());
                            let r = secret.range();
                            format!(
                                "{}{marker}{}",
                                &c[0][..r.start - whole.start],
                                &c[0][r.end - whole.start..]
                            )
                        }
                        None => marker.clone(),
                    }
                })
                .into_owned();
        }
        (out, count)
    }
}

/// `text` printed by a command of the call `ctx`, redacted when `security.redact_output` is on
/// (the secrets of this process's environment and of the command's own), with the count.
pub fn redact_command_output(text: String, ctx: &crate::ToolContext) -> (String, usize) {
    if !enabled() {
        return (text, 0);
    }
    let own = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let given = ctx.env.iter().flat_map(|e| e.iter().cloned());
    Redactor::from_env(own.chain(given)).redact(&text)
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
            ("OPENAI sk-proj-abcdefghijklmnopqrstuvwx", "openai_key"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic_key"),
            ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
            ("Authorization: Bearer abcdefghijklmnop1234", "bearer_token"),
            ("postgres://app:hunter2secret@db:5432/x", "url_password"),
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
        let pem =
            "a\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----\nb";
        let (out, n) = formats(pem);
        assert_eq!((out.as_str(), n), ("a\n[REDACTED:private_key]\nb", 1));
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
}
