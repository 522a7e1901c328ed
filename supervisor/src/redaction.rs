//! Redaction of an execution's result (SPEC §8, `security.redact_output`).
//!
//! The script's environment was scrubbed, but it can still print secrets it found elsewhere
//! (a `.env` file, a tool result, a credential format in a log it reads). Before the result
//! leaves the supervisor, the values of the secret variables the scrubber removed and
//! well-known credential formats are replaced by markers ([`vibeos_tools::redact`]); the count
//! goes into the result (`"redactions"`), so a caller can tell output was changed.

use crate::result::ExecutionResult;
use std::ffi::OsString;
use vibeos_tools::redact::{enabled, Redactor};

/// Variables holding a service's address, which backend errors name in clear (see [`apply`]).
const ENDPOINT_VARS: [&str; 2] = ["DAYTONA_API_URL", "MODAL_SERVER_URL"];

/// How many redaction markers (`[REDACTED…]`) `text` holds.
fn markers_in(text: &str) -> usize {
    text.matches("[REDACTED").count()
}

/// Redacts `result.output` and `result.error` against the secrets of `base_env` (the
/// environment the child's was scrubbed from), unless `security.redact_output` is off.
pub fn apply(result: &mut ExecutionResult, base_env: &[(OsString, OsString)]) {
    if !enabled() {
        return;
    }
    // Nothing to redact in an empty result; building the redactor (its patterns and the
    // secret matcher) is a measurable share of a cold no-op run.
    if result.output.is_empty() && result.error.as_deref().is_none_or(str::is_empty) {
        result.redactions = 0;
        return;
    }
    // A value that is not UTF-8 is looked for in the form the output has after its lossy
    // decoding (U+FFFD for each bad byte): skipping it let a script print it.
    let redactor = Redactor::from_env(
        base_env
            .iter()
            .map(|(k, v)| (k.to_string_lossy(), v.to_string_lossy())),
    );
    let raw_last_line = result
        .error
        .as_ref()
        .and(last_line(&result.output))
        .map(str::to_owned);
    let (output, n) = redactor.redact(&result.output);
    let mut total = n;
    // A failed script's error quotes the last line of its stderr, which ends the output. Alone,
    // that line can be a piece of a secret whose start is on the lines before it (the last
    // line of a private key, the value under `aws_secret_access_key =`): the output redacts it
    // in context, so the error quotes the line as the output shows it.
    let error = result
        .error
        .take()
        .map(|error| match (&raw_last_line, last_line(&output)) {
            (Some(raw), Some(shown)) if raw != shown => match error.strip_suffix(raw.as_str()) {
                Some(what) => {
                    // What the output's redaction replaced in that line is replaced in the
                    // error too, and counted there as well.
                    total += markers_in(shown).saturating_sub(markers_in(raw));
                    format!("{what}{shown}")
                }
                None => error,
            },
            _ => error,
        });
    result.output = output;
    if let Some(error) = error {
        // The error is the supervisor's own text, and a backend's "cannot reach the service"
        // names the endpoint to check: service addresses are not secrets (`doctor` prints
        // them), so their values stay readable there. They are still scrubbed from every
        // environment and redacted from the script's output; a password inside such a URL is
        // still caught by the URL credential format.
        let endpoint_redactor;
        let redactor = if base_env
            .iter()
            .any(|(k, _)| ENDPOINT_VARS.iter().any(|e| k == e))
        {
            endpoint_redactor = Redactor::from_env(base_env.iter().filter_map(|(k, v)| {
                let k = k.to_string_lossy();
                (!ENDPOINT_VARS.contains(&k.as_ref())).then(|| (k, v.to_string_lossy()))
            }));
            &endpoint_redactor
        } else {
            &redactor
        };
        let (error, n) = redactor.redact(&error);
        total += n;
        result.error = Some(error);
    }
    result.redactions = total;
}

/// The last line of `text` with anything but whitespace, trimmed.
fn last_line(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::trim)
}
