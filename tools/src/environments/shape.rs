//! What a persistent environment was made from, and how the current settings differ.
//!
//! A persistent container or sandbox outlives the host that made it; reused as it is under
//! settings that changed, it would run another image, miss a volume or keep one the settings
//! dropped, with other limits, and nothing would say so. So each is labelled with the settings
//! it was made from (a JSON object as text), and a reuse compares them with what the current
//! settings would make: a difference is refused with an error naming the settings, since
//! making it again would lose what is in it.

use serde_json::Value;

/// The label holding what an environment was made from.
pub(crate) const SHAPE_LABEL: &str = "vibeos-exec.shape";

/// How `made_from` (a persistent environment's label) differs from `now`, each changed key
/// named by `named` (a setting's name); `None` when they are the same. An environment without
/// the label (made by an older version) cannot be judged and counts as different.
pub(crate) fn change(made_from: &str, now: &str, named: fn(&str) -> &str) -> Option<String> {
    if made_from == now {
        return None;
    }
    let (Ok(Value::Object(old)), Ok(Value::Object(new))) = (
        serde_json::from_str::<Value>(made_from),
        serde_json::from_str::<Value>(now),
    ) else {
        return Some("it does not say which: it was made by another version".into());
    };
    let changed: Vec<String> = new
        .iter()
        .filter(|(k, v)| old.get(k.as_str()) != Some(v))
        .map(|(k, v)| {
            let was = old.get(k.as_str()).cloned().unwrap_or(Value::Null);
            format!("{}: {was} then, {v} now", named(k))
        })
        .collect();
    Some(if changed.is_empty() {
        "it was made by another version".into()
    } else {
        changed.join("; ")
    })
}
