//! `web_search` and `web_extract`: the web toolset, over pluggable HTTP backends.
//!
//! Nothing here reaches the network until an operator configures a backend, and both tools
//! report themselves unavailable (`check_fn`) until then, so they never appear in a script's stub
//! unconfigured. Configuration — environment variables win over config.yaml:
//!
//! | setting | env var | config.yaml |
//! |---|---|---|
//! | search backend | `VIBEOS_WEB_SEARCH_URL` (a SearXNG base URL) | `web: {search_backend: searxng, searxng_url: http://127.0.0.1:8888}` |
//! | extract backend | `VIBEOS_WEB_EXTRACT_BACKEND=http` | `web: {extract_backend: http}` |
//! | timeout (s) | `VIBEOS_WEB_TIMEOUT` | `web: {timeout: 20}` |
//!
//! `searxng` queries `<url>/search?q=…&format=json` (the instance must allow the JSON format).
//! `http` fetches each URL itself, decodes it with the charset it declares and turns HTML into
//! plain text with `html2text` (bounded in nesting depth and time; see `web_text`).
//!
//! Result shapes follow the seeds: `web_search(q)["data"]["web"]` is a list of
//! `{title, url, description}`; `web_extract([url])["results"]` is a list of
//! `{url, title, content, error}` — one entry per URL, a failed URL carrying its `error` rather
//! than failing the whole call.

use super::args::{in_range, parse, schema_for};
use crate::async_bridge::run_async;
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// Largest response body read.
const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;
/// Default cap of extracted characters per page when `char_limit` is not given.
const DEFAULT_CHAR_LIMIT: usize = 100_000;
/// Most URLs per extract call.
const MAX_URLS: usize = 20;
/// Most characters of content in one extract call, all pages together: 20 pages at the
/// largest `char_limit` made a 100M-character result (350 MB in the server) no script or
/// model can use.
const MAX_TOTAL_CHARS: usize = 2_000_000;

/// The web settings in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebConfig {
    /// SearXNG base URL, when search is configured.
    pub searxng_url: Option<String>,
    /// Whether the plain-HTTP extract backend is enabled.
    pub extract_http: bool,
    /// Request timeout.
    pub timeout: Duration,
}

/// Reads the web settings (env vars first, then config.yaml `web:`).
pub fn web_config() -> WebConfig {
    let sec = crate::settings::current_or_default()
        .web
        .clone()
        .unwrap_or_default();
    let get = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let searxng_url = env("VIBEOS_WEB_SEARCH_URL").or_else(|| {
        let backend = get(&sec.search_backend).unwrap_or_else(|| "searxng".into());
        (backend.eq_ignore_ascii_case("searxng"))
            .then(|| get(&sec.searxng_url))
            .flatten()
    });
    let extract_http = env("VIBEOS_WEB_EXTRACT_BACKEND")
        .or_else(|| get(&sec.extract_backend))
        .is_some_and(|b| b.eq_ignore_ascii_case("http"));
    let timeout = env("VIBEOS_WEB_TIMEOUT")
        .and_then(|t| t.parse::<u64>().ok())
        .or(sec.timeout)
        .filter(|t| (1..=600).contains(t))
        .unwrap_or(20);
    WebConfig {
        searxng_url: searxng_url.map(|u| u.trim_end_matches('/').to_string()),
        extract_http,
        timeout: Duration::from_secs(timeout),
    }
}

/// The HTTP client of the web tools: the same reqwest stack the MCP client uses (rustls with
/// the ring provider), one request timeout for the whole exchange, at most 5 redirects.
/// `no_redirects` for a strict script's fetches: each hop would need the destination check again.
fn http_client(timeout: Duration, no_redirects: bool) -> Result<reqwest::Client, ToolError> {
    // reqwest is built without a default TLS provider; install ring once (a no-op later).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(if no_redirects {
            reqwest::redirect::Policy::none()
        } else {
            reqwest::redirect::Policy::limited(5)
        })
        .user_agent("vibeos-exec web tools")
        // A redirect to another site must not learn the URL (query and all) it came from.
        .referer(false);
    // A strict script's fetch connects only to the public addresses its names resolve to
    // (checked again at connect time; see `PublicOnlyResolver`), and through no proxy, whose
    // own address would be the one connected to.
    let builder = if no_redirects {
        builder
            .no_proxy()
            .dns_resolver(std::sync::Arc::new(crate::path_policy::PublicOnlyResolver))
    } else {
        builder
    };
    builder.build().map_err(|e| {
        ToolError::new(
            crate::ToolErrorKind::HttpClientError,
            format!("cannot set up HTTP: {e}"),
        )
    })
}

/// An HTTP error with its causes ("error sending request: connection refused"): reqwest's own
/// message leaves out the why.
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A response body of at most `limit` bytes: `Ok((body, false))`, or the first `limit` bytes
/// and `true` when it is longer (the rest is not read).
async fn read_capped(
    resp: &mut reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// The arguments of `web_search`: its schema and its parser.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WebSearchArgs {
    /// Search query
    query: String,
    #[serde(default = "default_results")]
    #[schemars(range(min = 1, max = 50))]
    limit: i64,
}

fn default_results() -> i64 {
    5
}

/// The arguments of `web_extract`: its schema and its parser.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WebExtractArgs {
    /// http(s) URLs (a single string is accepted too)
    #[schemars(schema_with = "urls_schema")]
    urls: Urls,
    /// Most characters of text per page (default 100000)
    #[schemars(range(min = 1))]
    char_limit: Option<i64>,
}

/// The published schema of `urls`: an array of strings or one string, so the generic argument
/// check (which reads `type`) lets a single URL through to [`Urls::One`].
fn urls_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["array", "string"],
        "items": {"type": "string"},
        "maxItems": MAX_URLS
    })
}

/// `urls`: a list, or one URL as a plain string (models send both).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Urls {
    One(String),
    Many(Vec<String>),
}

fn search_entry() -> ToolEntry {
    let mut e = ToolEntry::new(
        "web_search",
        "web",
        "Search the web. Returns data.web = [{title, url, description}].",
        schema_for::<WebSearchArgs>(),
        web_search,
    )
    .with_emoji("🔍")
    .with_parallel_safe(true)
    .with_instant_check(|| web_config().searxng_url.is_some());
    e.requires_env = vec!["VIBEOS_WEB_SEARCH_URL".into()];
    e
}

fn extract_entry() -> ToolEntry {
    let mut e = ToolEntry::new(
        "web_extract",
        "web",
        "Fetch web pages and return their text. Returns results = [{url, title, content, error}].",
        schema_for::<WebExtractArgs>(),
        web_extract,
    )
    .with_emoji("📄")
    .with_parallel_safe(true)
    .with_instant_check(|| web_config().extract_http);
    e.requires_env = vec!["VIBEOS_WEB_EXTRACT_BACKEND".into()];
    e
}

inventory::submit! { BuiltinTool(search_entry) }
inventory::submit! { BuiltinTool(extract_entry) }

fn not_configured(what: &str, how: &str) -> ToolError {
    ToolError::new(
        crate::ToolErrorKind::NotConfigured,
        format!(
            "{what} has no backend configured: {how}, or the `web:` section of {}",
            crate::settings::config_path().display()
        ),
    )
}

fn web_search(args: &Map<String, Value>, _ctx: &ToolContext) -> Result<Value, ToolError> {
    let a: WebSearchArgs = parse(args)?;
    let query = a.query.trim();
    if query.is_empty() {
        return Err(ToolError::invalid_args("argument `query` is empty"));
    }
    if query.len() > 2000 {
        return Err(ToolError::invalid_args(format!(
            "argument `query` is {} bytes; keep it under 2000",
            query.len()
        )));
    }
    let limit = in_range("limit", a.limit, 1, 50)? as usize;
    let cfg = web_config();
    let base = cfg.searxng_url.ok_or_else(|| {
        not_configured("web_search", "set VIBEOS_WEB_SEARCH_URL to a SearXNG URL")
    })?;
    // What a script is shown of the operator's URL: scheme, host and path. Its user, password
    // and query (`?apikey=…`) are the operator's, and every backend error quoted them whole, in
    // strict mode too (output redaction caught the password only as printed).
    let mut url = reqwest::Url::parse(&base).map_err(|e| {
        ToolError::new(
            crate::ToolErrorKind::SearchBackendError,
            format!(
                "the configured SearXNG URL {} is not a usable URL ({e})",
                crate::url_mask::mask_url(&base)
            ),
        )
    })?;
    // `/search` goes after the base's path, before its query (appending text put it after a
    // `?apikey=…`).
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().push("search");
    }
    let mut shown_url = url.clone();
    let _ = shown_url.set_username("");
    let _ = shown_url.set_password(None);
    shown_url.set_query(None);
    shown_url.set_fragment(None);
    let backend_error = |e: String| {
        ToolError::new(
            crate::ToolErrorKind::SearchBackendError,
            format!("{shown_url}: {e}"),
        )
    };
    url.query_pairs_mut()
        .append_pair("q", query)
        .append_pair("format", "json");
    let target = url;
    let client = http_client(cfg.timeout, false)?;
    let (status, body) = run_async(Box::pin(async move {
        let mut resp = client.get(target).send().await?;
        let status = resp.status();
        read_capped(&mut resp, MAX_BODY_BYTES)
            .await
            .map(|(body, cut)| (status, body, cut))
    }))?
    .map_err(|e| backend_error(describe(&e.without_url())))
    .and_then(|(status, body, cut)| {
        if cut {
            Err(backend_error(format!(
                "the response is larger than {MAX_BODY_BYTES} bytes"
            )))
        } else {
            Ok((status, body))
        }
    })?;
    if !status.is_success() {
        return Err(ToolError::new(
            crate::ToolErrorKind::SearchBackendError,
            format!(
                "{shown_url} answered HTTP {status}{}",
                if status.as_u16() == 403 {
                    " (SearXNG refuses format=json unless `search.formats` lists json)"
                } else {
                    ""
                }
            ),
        ));
    }
    let parsed: Value = serde_json::from_slice(&body).map_err(|e| {
        ToolError::new(
            crate::ToolErrorKind::SearchBackendError,
            format!("{shown_url} did not return JSON ({e}); is it a SearXNG instance with format=json enabled?"),
        )
    })?;
    let web: Vec<Value> = parsed
        .get("results")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .filter_map(|r| {
                    let url = r.get("url")?.as_str()?;
                    Some(json!({
                        "title": r.get("title").and_then(Value::as_str).unwrap_or(""),
                        "url": url,
                        "description": r.get("content").and_then(Value::as_str).unwrap_or(""),
                    }))
                })
                .take(limit)
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({"success": true, "query": query, "data": {"web": web}}))
}

static TITLE: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(r"(?is)<title[^>]*>(.*?)</title>").ok());

/// Most characters of a page's title kept: a title is a line, and 20 pages with 3,000,000-
/// character titles made a 60-million-character answer past every other cap (stop 60's probe).
const MAX_TITLE_CHARS: usize = 1_000;

fn html_title(html: &str) -> String {
    TITLE
        .as_ref()
        .and_then(|re| re.captures(html))
        .and_then(|c| c.get(1))
        .map(|m| {
            // Entities and tags of the title's first part only: it is cut to a line anyway.
            let raw = m.as_str();
            let mut end = raw.len().min(MAX_TITLE_CHARS * 8);
            while !raw.is_char_boundary(end) {
                end -= 1;
            }
            let text = html2text::from_read(&raw.as_bytes()[..end], 10_000)
                .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            match text.char_indices().nth(MAX_TITLE_CHARS) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text,
            }
        })
        .unwrap_or_default()
}

/// Pages converted to text at once in this process, across calls and executions: a page may
/// take about 80 MB while it converts ([`super::web_text::MAX_ELEMENTS`]), and one call fetches
/// up to 20 pages, any number of calls at a time. The others wait for a turn (within their
/// deadline), on no thread: the conversion itself runs on the blocking pool.
static CONVERSIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// `html` converted on the blocking pool when its turn comes ([`CONVERSIONS`]), stopping at
/// `deadline` or when `ended` is set; `(title, text)`, or the error.
async fn converted(
    html: String,
    deadline: std::time::Instant,
    timeout: Duration,
    ended: crate::EndedFlag,
) -> Result<(String, String), String> {
    let turn = tokio::time::timeout_at(deadline.into(), CONVERSIONS.acquire()).await;
    let Ok(Ok(_permit)) = turn else {
        return Err(super::web_text::ConvertError::TimedOut(timeout.as_secs()).to_string());
    };
    tokio::task::spawn_blocking(move || {
        let stop = || ended.is_set();
        let until = super::web_text::Until {
            deadline,
            timeout_secs: timeout.as_secs(),
            ended: &stop,
        };
        let text = super::web_text::html_to_text(&html, &until).map_err(|e| e.to_string())?;
        Ok((html_title(&html), text))
    })
    .await
    .unwrap_or_else(|_| Err("internal error while converting the page".into()))
}

/// One page of `web_extract`: fetched, decoded and converted by `deadline` (call start plus
/// `timeout`), or an entry carrying the error.
async fn fetch_one(
    client: &reqwest::Client,
    url: &str,
    char_limit: usize,
    denied: Option<String>,
    (deadline, timeout): (std::time::Instant, Duration),
    ended: crate::EndedFlag,
) -> Value {
    let fail = |msg: String| json!({"url": url, "title": "", "content": "", "error": msg});
    let scheme_ok = url.split_once("://").is_some_and(|(s, rest)| {
        (s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https")) && !rest.is_empty()
    });
    if !scheme_ok {
        return fail("only http:// and https:// URLs can be fetched".into());
    }
    if let Some(why) = denied {
        return fail(why);
    }
    let mut resp = match client.get(url).send().await {
        Ok(r) => r,
        Err(e) => return fail(format!("fetch failed: {}", describe(&e))),
    };
    let status = resp.status();
    // Lower-cased for the type checks; charset labels are case-insensitive too.
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // A page past the cap is converted from its first MAX_BODY_BYTES.
    let body = match read_capped(&mut resp, MAX_BODY_BYTES).await {
        Ok((body, _)) => body,
        Err(e) => return fail(format!("reading the response failed: {}", describe(&e))),
    };
    if status.is_redirection() {
        // A strict script's fetches follow no redirect (each hop would need the destination
        // check again); others follow up to 5 and hand back only one reqwest would not
        // follow: to another scheme.
        let target = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let web_target = ["http://", "https://"].iter().any(|s| {
            target
                .get(..s.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(s))
        });
        return fail(if target.is_empty() {
            format!("HTTP {status} without a Location header: nothing to follow")
        } else if !web_target && target.contains(':') {
            format!(
                "HTTP {status}: redirect to {target} refused: web_extract fetches only \
                 http:// and https:// URLs"
            )
        } else {
            format!(
                "HTTP {status}: redirect to {target} not followed: a strict script's \
                 web_extract follows no redirects (each hop would need the public-host check \
                 again); fetch the final http(s) URL directly"
            )
        });
    }
    if !status.is_success() {
        return fail(format!("HTTP {status}"));
    }
    let looks_html = ctype.contains("html")
        || (ctype.is_empty()
            && body
                .iter()
                .take(1024)
                .copied()
                .collect::<Vec<u8>>()
                .to_ascii_lowercase()
                .windows(5)
                .any(|w| w == b"<html"));
    let (title, text) = if looks_html {
        let html = super::web_text::decode(&body, &ctype, true);
        drop(body);
        match converted(html, deadline, timeout, ended).await {
            Ok(pair) => pair,
            Err(e) => return fail(e),
        }
    } else if ctype.starts_with("text/")
        || ctype.contains("json")
        || ctype.contains("xml")
        || ctype.contains("javascript")
        || (ctype.is_empty() && !body.contains(&0))
    {
        (String::new(), super::web_text::decode(&body, &ctype, false))
    } else {
        return fail(format!(
            "content type {ctype:?} is not text; web_extract returns text only"
        ));
    };
    let total_chars = text.chars().count();
    let content = match text.char_indices().nth(char_limit) {
        Some((cut, _)) => format!(
            "{}\n\n[... content cut at {char_limit} of {total_chars} characters]",
            &text[..cut]
        ),
        None => text,
    };
    json!({"url": url, "title": title, "content": content, "error": Value::Null})
}

fn web_extract(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    let a: WebExtractArgs = parse(args)?;
    let urls = match a.urls {
        Urls::One(u) => vec![u],
        Urls::Many(list) => list,
    };
    if urls.is_empty() {
        return Err(ToolError::invalid_args("argument `urls` is empty"));
    }
    if urls.len() > MAX_URLS {
        return Err(ToolError::invalid_args(format!(
            "argument `urls` has {} entries; at most {MAX_URLS} per call",
            urls.len()
        )));
    }
    let char_limit = in_range(
        "char_limit",
        a.char_limit.unwrap_or(DEFAULT_CHAR_LIMIT as i64),
        1,
        10_000_000,
    )? as usize;
    let cfg = web_config();
    if !cfg.extract_http {
        return Err(not_configured(
            "web_extract",
            "set VIBEOS_WEB_EXTRACT_BACKEND=http",
        ));
    }
    // A strict script has no network of its own; through this tool it reaches public hosts
    // only (no loopback, private or link-local address, no redirect that could lead there).
    // The check resolves names (blocking), so it runs here, before the async fetches.
    let public_only = ctx.paths.is_some();
    let denied: Vec<Option<String>> = urls
        .iter()
        .map(|u| {
            public_only
                .then(|| crate::path_policy::public_destination(u).err())
                .flatten()
        })
        .collect();
    let client = http_client(cfg.timeout, public_only)?;
    let budget = (std::time::Instant::now() + cfg.timeout, cfg.timeout);
    let ended = crate::call_scope::ended_flag(ctx);
    // All pages at once, results in the order of `urls`.
    let results: Vec<Value> = run_async(Box::pin(async move {
        let fetches: Vec<_> = urls
            .into_iter()
            .zip(denied)
            .map(|(url, denied)| {
                let (client, target, ended) = (client.clone(), url.clone(), ended.clone());
                let task = tokio::spawn(async move {
                    fetch_one(&client, &target, char_limit, denied, budget, ended).await
                });
                (url, task)
            })
            .collect();
        let mut results = Vec::with_capacity(fetches.len());
        for (url, task) in fetches {
            results.push(task.await.unwrap_or_else(|_| {
                json!({"url": url, "title": "", "content": "", "error": "internal error while fetching"})
            }));
        }
        results
    }))?;
    Ok(json!({"results": cap_total(results, MAX_TOTAL_CHARS)}))
}

/// `results` with their `content` cut so that all pages together hold at most `cap`
/// characters; a cut page says so at its end, and pages past the cap keep only that note.
fn cap_total(mut results: Vec<Value>, cap: usize) -> Vec<Value> {
    let mut left = cap;
    for r in &mut results {
        let Some(content) = r.get("content").and_then(Value::as_str) else {
            continue;
        };
        match content.char_indices().nth(left) {
            None => left -= content.chars().count(),
            Some((cut, _)) => {
                let total = content.chars().count();
                let kept = format!(
                    "{}\n\n[... content cut at {left} of {total} characters: web_extract returns \
                     at most {cap} characters per call, all pages together; fetch fewer pages \
                     per call]",
                    &content[..cut]
                );
                r["content"] = Value::String(kept);
                left = 0;
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_and_parsers_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<WebSearchArgs>(
            &search_entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Search query"},
                    "limit": {"type": "integer", "default": 5, "minimum": 1, "maximum": 50}
                },
                "required": ["query"]
            }),
            json!({"query": "rust yaml crates", "limit": 3}),
            json!({"query": ["a"]}),
        );
        super::super::args::assert_schema_and_parser_agree::<WebExtractArgs>(
            &extract_entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "urls": {"type": ["array", "string"], "items": {"type": "string"}, "maxItems": MAX_URLS, "description": "http(s) URLs (a single string is accepted too)"},
                    "char_limit": {"type": "integer", "minimum": 1, "description": "Most characters of text per page (default 100000)"}
                },
                "required": ["urls"]
            }),
            json!({"urls": ["http://127.0.0.1:8000/a"], "char_limit": 500}),
            json!({"urls": [1, 2]}),
        );
        let one: WebExtractArgs =
            super::super::args::parse(json!({"urls": "http://x"}).as_object().unwrap()).unwrap();
        assert!(matches!(one.urls, Urls::One(_)));
    }
}
