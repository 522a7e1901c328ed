//! What a secret looks like, by its name and by its shape: the rules output redaction
//! ([`crate::redact`]) and URL masking ([`crate::url_mask`]) share.
//!
//! Kept below both (it reads `policies/env.json` itself rather than through the redaction
//! patterns), so URL masking, which the MCP client uses, does not depend on the redaction
//! module and its settings.

use serde::Deserialize;
use std::sync::LazyLock;

const ENV_JSON: &str = include_str!("../../policies/env.json");

#[derive(Deserialize)]
struct EnvNames {
    deny_substrings: Vec<String>,
}

/// The environment policy's `deny_substrings`, upper-cased; `None` when the file cannot be read
/// (callers then treat every name as secret).
static DENY_SUBSTRINGS: LazyLock<Option<Vec<String>>> = LazyLock::new(|| {
    crate::policy_file::parse::<EnvNames>(ENV_JSON, "policies/env.json")
        .map(|names| {
            names
                .deny_substrings
                .iter()
                .map(|s| s.to_ascii_uppercase())
                .collect()
        })
        .map_err(|e| tracing::error!("{e}"))
        .ok()
});

/// Whether `name` holds a secret by the environment policy's `deny_substrings` (`KEY`, `TOKEN`,
/// `SECRET`, `PASSWORD`, `AUTH`, …), case-insensitively. Fails closed: with no policy to tell,
/// every name counts as secret.
pub(crate) fn name_looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    DENY_SUBSTRINGS
        .as_ref()
        .is_none_or(|subs| subs.iter().any(|s| upper.contains(s.as_str())))
}

/// Whether `s` looks like a random token rather than words: one of its segments (split at
/// `-`, `_`, `.`) is at least 8 characters long and mixes two of lowercase letters, uppercase
/// letters and digits. A key's random body always has such a segment; a name like
/// `sk-payments-service-deployment-v2` has none.
pub(crate) fn looks_like_token(s: &str) -> bool {
    s.split(['-', '_', '.']).any(|seg| {
        let classes = [
            seg.bytes().any(|b| b.is_ascii_lowercase()),
            seg.bytes().any(|b| b.is_ascii_uppercase()),
            seg.bytes().any(|b| b.is_ascii_digit()),
        ];
        seg.len() >= 8 && classes.iter().filter(|c| **c).count() >= 2
    })
}
