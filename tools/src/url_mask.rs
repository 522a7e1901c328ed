//! Credentials in URLs, masked wherever a configured URL is shown or logged (secrets' values are
//! never logged).
//!
//! An MCP server's `url:` may carry a password (`https://user:pass@host/mcp`) or a key in its
//! query (`?api_key=…`), and the URL is shown by `tools list`, in warnings and in the log, where
//! errors of the HTTP client quote it too. What is masked, as `***`:
//! - the password of the userinfo, and a user name that looks like a token (the
//!   `https://<token>@host` form some services use);
//! - the value of every query or fragment parameter whose name the environment policy counts as
//!   secret (its `deny_substrings`: `KEY`, `TOKEN`, `SECRET`, `PASSWORD`, `AUTH`, …, the rule
//!   that decides which variables execute_code scrubs as secret),
//!   plus `PASS` and `SIG` (`?pass=…`, a signed URL's `sig=…`), which variables rarely use but
//!   URLs do.
//!
//! The host, the path and the other parameters stay, so the URL still says which server it is.

/// What a masked part is replaced by.
const MASK: &str = "***";

/// Name fragments of URL parameters that hold credentials besides the environment policy's.
const EXTRA_SECRET_PARAMS: [&str; 2] = ["PASS", "SIG"];

/// `url` with its credentials masked (see the module docs). Text that is not a URL
/// (no `scheme://`) comes back unchanged.
pub fn mask_url(url: &str) -> String {
    let Some(sep) = url.find("://") else {
        return url.to_string();
    };
    let start = sep + 3;
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..authority_end];
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..start]);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(masked_user(user));
                    out.push(':');
                    out.push_str(MASK);
                }
                None => out.push_str(masked_user(userinfo)),
            }
            out.push('@');
            out.push_str(&authority[at + 1..]);
        }
        None => out.push_str(authority),
    }
    let rest = &url[authority_end..];
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (rest, None),
    };
    let (path, query) = match before_fragment.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (before_fragment, None),
    };
    out.push_str(path);
    if let Some(q) = query {
        out.push('?');
        out.push_str(&masked_params(q));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(&masked_params(f));
    }
    out
}

/// `text` with every URL in it masked by [`mask_url`]: error messages of HTTP clients quote
/// the URL they failed on. A URL runs from its scheme to the first blank, quote or bracket.
pub fn mask_urls_in(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme: letters, digits, `+`, `-`, `.` before `://`, starting with a letter.
        let scheme_start = rest[..sep]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(sep, |(i, _)| i);
        let end = rest[sep..]
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '(' | ')' | '`')
            })
            .map_or(rest.len(), |i| sep + i);
        out.push_str(&rest[..scheme_start]);
        out.push_str(&mask_url(&rest[scheme_start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn masked_user(user: &str) -> &str {
    if crate::secret_shape::looks_like_token(user) {
        MASK
    } else {
        user
    }
}

fn masked_params(params: &str) -> String {
    params
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !value.is_empty() && secret_param(name) => {
                format!("{name}={MASK}")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn secret_param(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    crate::secret_shape::name_looks_secret(name)
        || EXTRA_SECRET_PARAMS.iter().any(|s| upper.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_secret_parameters_are_masked_and_the_rest_kept() {
        assert_eq!(
            mask_url("http://user:pa55@host:8080/mcp?api_key=k123&x=1#access_token=t"),
            "http://user:***@host:8080/mcp?api_key=***&x=1#access_token=***"
        );
        assert_eq!(
            mask_url("https://ghp_a1B2c3D4e5F6g7H8@github.com/x"),
            "https://***@github.com/x"
        );
        assert_eq!(
            mask_url("https://alice@host/p?q=rust&sig=abc&Password=p"),
            "https://alice@host/p?q=rust&sig=***&Password=***"
        );
        assert_eq!(mask_url("http://127.0.0.1:9/mcp"), "http://127.0.0.1:9/mcp");
        assert_eq!(mask_url("not a url"), "not a url");
        // An `@` in the path is no userinfo.
        assert_eq!(mask_url("http://h/a@b"), "http://h/a@b");
    }

    #[test]
    fn urls_inside_text_are_masked() {
        assert_eq!(
            mask_urls_in(
                "error sending request for url (http://h/mcp?token=s3cr3t): refused; see https://u:p@x/"
            ),
            "error sending request for url (http://h/mcp?token=***): refused; see https://u:***@x/"
        );
        assert_eq!(mask_urls_in("no url here"), "no url here");
        assert_eq!(mask_urls_in("://odd"), "://odd");
    }
}
