//! `TERMINAL_CWD`, the session working dir an agent host exports (SPEC §3).
//!
//! Hosts write it the way a shell user would, so `~` and `~/src` must mean the home directory,
//! as they do in the original system; nothing else is expanded (no `$VARS`), because a value
//! that changes with the environment would make the working dir depend on what a script sees.

use std::path::PathBuf;

/// `TERMINAL_CWD` with a leading `~` or `~/` expanded to `$HOME`; `None` when unset or empty.
pub fn from_env() -> Option<PathBuf> {
    let raw = std::env::var_os("TERMINAL_CWD").filter(|v| !v.is_empty())?;
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    Some(expand(&raw.to_string_lossy(), home.map(PathBuf::from)))
}

/// Expands a leading `~` (alone or followed by `/`) to `home`; other values are kept.
pub fn expand(value: &str, home: Option<PathBuf>) -> PathBuf {
    match (value.strip_prefix('~'), home) {
        (Some(""), Some(h)) => h,
        (Some(rest), Some(h)) if rest.starts_with('/') => h.join(rest.trim_start_matches('/')),
        _ => PathBuf::from(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_means_home_and_nothing_else_changes() {
        let home = Some(PathBuf::from("/home/u"));
        assert_eq!(expand("~", home.clone()), PathBuf::from("/home/u"));
        assert_eq!(
            expand("~/src/x", home.clone()),
            PathBuf::from("/home/u/src/x")
        );
        assert_eq!(expand("~other/x", home.clone()), PathBuf::from("~other/x"));
        assert_eq!(expand("/srv/$HOME", home), PathBuf::from("/srv/$HOME"));
        assert_eq!(expand("~", None), PathBuf::from("~"));
    }
}
