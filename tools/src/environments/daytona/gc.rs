//! `vibeos-exec backends gc` for Daytona: the sandboxes a crashed host left.
//!
//! A non-persistent sandbox is deleted when its environment stops, so one that is still listed
//! with a dead owner was left by a host that died. Found by the labels every sandbox of this
//! product carries ([`crate::environments::owner`]) and judged by the same rule as the other
//! cloud backend's.

use super::api::{message, Api, Credentials};
use super::err;
use crate::environments::docker::GcReport;
use crate::environments::owner::{cloud_verdict, Verdict, PRODUCT};
use crate::environments::EnvError;
use serde_json::Value;

/// Deletes the sandboxes labelled `vibeos-exec=1` whose owner on this machine is gone (with
/// `all`, persistent ones too). Reads the credentials from the environment.
pub fn gc(all: bool) -> Result<GcReport, EnvError> {
    let api = Api::new(Credentials::from_env()?)?;
    let listed = list_ours(&api)?;
    let mut report = GcReport::default();
    for sb in &listed {
        let Some(id) = sb.get("id").and_then(Value::as_str) else {
            continue;
        };
        let name = sb
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(id)
            .to_string();
        let labels = sb.get("labels").cloned().unwrap_or(Value::Null);
        match cloud_verdict(&labels, all) {
            Verdict::Keep(why) => {
                tracing::info!(sandbox = %name, "backends gc: daytona sandbox kept: {why}");
                report.kept.push(name);
            }
            Verdict::Remove => {
                let (s, v) =
                    api.control(reqwest::Method::DELETE, &format!("/sandbox/{id}"), None)?;
                // Gone meanwhile is as good as removed.
                if !((200..300).contains(&s) || s == 404) {
                    return Err(err(
                        format!("deleting sandbox {name}"),
                        format!("HTTP {s}: {}", message(&v)),
                    ));
                }
                report.removed.push(name);
            }
        }
    }
    Ok(report)
}

/// Every sandbox labelled `vibeos-exec=1`. The API answers a page (`items`, and the
/// `nextCursor` of the next page, null on the last) as the pinned SDK's does, or, as older
/// versions did, one array of them all.
pub(super) fn list_ours(api: &Api) -> Result<Vec<Value>, EnvError> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/sandbox?{}", label_query());
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={}", encode(c)));
        }
        let (status, v) = api.control(reqwest::Method::GET, &path, None)?;
        if status != 200 {
            return Err(err(
                "listing sandboxes",
                format!("HTTP {status}: {}", message(&v)),
            ));
        }
        let (items, next) = match v {
            Value::Array(all) => (all, None),
            mut page => (
                match page.get_mut("items").map(Value::take) {
                    Some(Value::Array(items)) => items,
                    _ => {
                        return Err(err(
                            "listing sandboxes",
                            format!("the reply is neither a list nor a page: {page}"),
                        ))
                    }
                },
                page.get("nextCursor")
                    .and_then(Value::as_str)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string),
            ),
        };
        found.extend(items);
        // A cursor that does not move would loop for ever.
        if next.is_none() || next == cursor {
            return Ok(found);
        }
        cursor = next;
    }
}

/// `s` encoded for a query string value.
fn encode(s: &str) -> String {
    reqwest::Url::parse_with_params("http://localhost/", [("v", s)])
        .ok()
        .and_then(|u| u.query().map(|q| q.trim_start_matches("v=").to_string()))
        .unwrap_or_default()
}

/// `labels={"vibeos-exec":"1"}`, encoded for a query string.
fn label_query() -> String {
    format!(
        "labels={}",
        encode(&serde_json::json!({ PRODUCT: "1" }).to_string())
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_label_filter_is_encoded_as_the_probe_writes_it() {
        assert_eq!(
            super::label_query(),
            "labels=%7B%22vibeos-exec%22%3A%221%22%7D"
        );
    }
}
