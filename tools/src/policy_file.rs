//! Errors of the pattern policies under `policies/` (dangerous, hardline and redaction
//! patterns), which fail closed.
//!
//! These lists are security data: a pattern that silently drops out (a regex that no longer
//! compiles after an edit, a file that no longer parses) would let through exactly what it was
//! written to stop. So a broken policy is an error that names the file and the pattern, and
//! every user of it refuses — approval denies every command, redaction withholds the output —
//! until the file is fixed.

/// A pattern policy file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFileError {
    /// The file is not valid JSON of the expected shape.
    #[error("{file} is not a valid pattern policy: {message}; fix the file (nothing it guards runs until then)")]
    Parse {
        /// The policy file, e.g. `policies/dangerous_patterns.json`.
        file: String,
        /// What the JSON parser said.
        message: String,
    },
    /// One pattern's regex does not compile.
    #[error("{file}: pattern `{key}` ({field}) does not compile: {message}; fix the pattern (nothing it guards runs until then)")]
    Pattern {
        /// The policy file.
        file: String,
        /// The pattern's key or name.
        key: String,
        /// Which regex of the pattern (`regex`, `unless`).
        field: &'static str,
        /// What the regex compiler said.
        message: String,
    },
}

/// Parses a policy file's JSON text.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    json: &str,
    file: &str,
) -> Result<T, PolicyFileError> {
    serde_json::from_str(json).map_err(|e| PolicyFileError::Parse {
        file: file.to_string(),
        message: e.to_string(),
    })
}

/// Compiles one regex of a pattern, naming the pattern when it fails.
pub(crate) fn compile(
    builder: &mut regex::RegexBuilder,
    file: &str,
    key: &str,
    field: &'static str,
) -> Result<regex::Regex, PolicyFileError> {
    builder.build().map_err(|e| PolicyFileError::Pattern {
        file: file.to_string(),
        key: key.to_string(),
        field,
        message: e.to_string(),
    })
}
