//! Argument coercion to the types a tool's schema declares.
//!
//! Models often send `"5"` for an integer or `"true"` for a boolean, and scripts pass Python
//! values that JSON-encode slightly differently from the schema. Fixing the obvious cases once,
//! here, keeps every handler simple and gives one clear error (naming the parameter) when a value
//! cannot be read as the declared type. Only top-level properties with a declared `type` are
//! touched; everything else is passed through for the handler to judge. A tool can exempt
//! arguments (`ToolEntry::exact_type_args`): where a number is no slip but a wrong call (a
//! shell command, a directory), a value of another type is refused instead.

use serde_json::{Map, Number, Value};
use std::borrow::Cow;

/// Coerces `args` to `schema`'s property types, except those named in `exact`, which must
/// have a declared type already. Borrowed when nothing needed changing, so the common case
/// costs no copy.
pub fn coerce_args<'a>(
    schema: &Value,
    args: &'a Map<String, Value>,
    exact: &[String],
) -> Result<Cow<'a, Map<String, Value>>, String> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(Cow::Borrowed(args));
    };
    let mut changed: Option<Map<String, Value>> = None;
    for (key, value) in args {
        let Some(types) = props.get(key).and_then(declared_types) else {
            continue;
        };
        if let Some(new) = coerce_value(key, value, &types, exact.contains(key))? {
            changed
                .get_or_insert_with(|| args.clone())
                .insert(key.clone(), new);
        }
    }
    Ok(match changed {
        Some(m) => Cow::Owned(m),
        None => Cow::Borrowed(args),
    })
}

/// The arguments `schema`'s `required` lists that `args` leaves out, as an error naming them
/// (`None` when none is missing). `null` counts as left out unless the property's declared
/// types include `"null"`, as coercion and the built-ins' argument parsing read it.
pub fn missing_required(schema: &Value, args: &Map<String, Value>) -> Option<String> {
    let required = schema.get("required").and_then(Value::as_array)?;
    let props = schema.get("properties").and_then(Value::as_object);
    let missing: Vec<String> = required
        .iter()
        .filter_map(Value::as_str)
        .filter(|name| match args.get(*name) {
            None => true,
            Some(Value::Null) => !props
                .and_then(|p| p.get(*name))
                .and_then(declared_types)
                .is_some_and(|types| types.contains(&"null")),
            Some(_) => false,
        })
        .map(|name| format!("`{name}`"))
        .collect();
    match missing.as_slice() {
        [] => None,
        [one] => Some(format!("missing required argument {one}")),
        many => Some(format!("missing required arguments {}", many.join(", "))),
    }
}

fn declared_types(prop: &Value) -> Option<Vec<&str>> {
    match prop.get("type")? {
        Value::String(t) => Some(vec![t.as_str()]),
        Value::Array(list) => Some(list.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn matches(value: &Value, ty: &str) -> bool {
    match (ty, value) {
        ("string", Value::String(_))
        | ("boolean", Value::Bool(_))
        | ("number", Value::Number(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_))
        | ("null", Value::Null) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// `Ok(None)`: already fits. `Ok(Some(v))`: use `v`. `Err`: cannot fit (or, `exact`, does
/// not fit as it is).
fn coerce_value(
    key: &str,
    value: &Value,
    types: &[&str],
    exact: bool,
) -> Result<Option<Value>, String> {
    // Null stands for "not given" unless the schema says otherwise; handlers treat it so.
    if value.is_null() || types.is_empty() || types.iter().any(|t| matches(value, t)) {
        return Ok(None);
    }
    for ty in types.iter().filter(|_| !exact) {
        if let Some(v) = convert(value, ty) {
            return Ok(Some(v));
        }
    }
    let want = match types {
        [one] => article(one).to_string(),
        many => many
            .iter()
            .map(|t| article(t))
            .collect::<Vec<_>>()
            .join(" or "),
    };
    let mut shown = value.to_string();
    if shown.chars().count() > 80 {
        shown = shown.chars().take(80).collect::<String>() + "…";
    }
    // A whole number past 64 bits arrives as a float (`10**20` is `1e+20`): say why it is no
    // integer, or the message reads as if a fraction had been sent.
    let too_large = types.contains(&"integer")
        && value
            .as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0 && integral(f).is_none());
    if too_large {
        shown.push_str(", a whole number too large for a 64-bit integer");
    }
    Err(format!("argument `{key}` must be {want}, got {shown}"))
}

fn article(ty: &str) -> &str {
    match ty {
        "string" => "a string",
        "integer" => "an integer",
        "number" => "a number",
        "boolean" => "a boolean (true or false)",
        "array" => "an array",
        "object" => "an object",
        "null" => "null",
        other => other,
    }
}

fn convert(value: &Value, ty: &str) -> Option<Value> {
    match (ty, value) {
        ("integer", Value::String(s)) => {
            let s = s.trim();
            if let Ok(i) = s.parse::<i64>() {
                Some(Value::from(i))
            } else {
                s.parse::<f64>().ok().and_then(integral)
            }
        }
        ("integer", Value::Number(n)) => n.as_f64().and_then(integral),
        ("number", Value::String(s)) => {
            let s = s.trim();
            if let Ok(i) = s.parse::<i64>() {
                return Some(Value::from(i));
            }
            s.parse::<f64>()
                .ok()
                .and_then(Number::from_f64)
                .map(Value::Number)
        }
        ("boolean", Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(Value::Bool(true)),
            "false" | "0" | "no" => Some(Value::Bool(false)),
            _ => None,
        },
        ("boolean", Value::Number(n)) => match n.as_i64() {
            Some(1) => Some(Value::Bool(true)),
            Some(0) => Some(Value::Bool(false)),
            _ => None,
        },
        ("string", Value::Number(n)) => Some(Value::String(n.to_string())),
        ("string", Value::Bool(b)) => Some(Value::String(b.to_string())),
        ("array", Value::String(s)) => match serde_json::from_str::<Value>(s.trim()) {
            Ok(v @ Value::Array(_)) => Some(v),
            _ => None,
        },
        ("object", Value::String(s)) => match serde_json::from_str::<Value>(s.trim()) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => None,
        },
        _ => None,
    }
}

/// A whole-valued float that fits an i64 exactly.
fn integral(f: f64) -> Option<Value> {
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15).then(|| Value::from(f as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
            "s": {"type": "string"}, "a": {"type": "array"}, "o": {"type": "object"},
            "u": {"type": ["integer", "null"]}, "free": {}
        }})
    }

    fn coerce(v: Value) -> Result<Value, String> {
        let m = v.as_object().unwrap().clone();
        coerce_args(&schema(), &m, &[]).map(|c| Value::Object(c.into_owned()))
    }

    #[test]
    fn fixes_the_obvious_cases() {
        let out = coerce(
            json!({"n": "5", "x": "2.5", "b": "true", "s": 7, "a": "[1,2]",
                                "o": "{\"k\":1}", "u": "3", "free": "5", "extra": "5"}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"n": 5, "x": 2.5, "b": true, "s": "7", "a": [1, 2], "o": {"k": 1},
                   "u": 3, "free": "5", "extra": "5"})
        );
        assert_eq!(
            coerce(json!({"n": 4.0, "b": "False", "s": false})).unwrap(),
            json!({"n": 4, "b": false, "s": "false"})
        );
    }

    #[test]
    fn leaves_fitting_args_borrowed() {
        let m = json!({"n": 5, "s": "x", "u": null})
            .as_object()
            .unwrap()
            .clone();
        assert!(matches!(
            coerce_args(&schema(), &m, &[]).unwrap(),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn exact_arguments_are_refused_rather_than_coerced() {
        let exact = ["s".to_string(), "n".to_string()];
        let m = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            coerce_args(&schema(), &m(json!({"s": 5})), &exact).unwrap_err(),
            "argument `s` must be a string, got 5"
        );
        assert_eq!(
            coerce_args(&schema(), &m(json!({"n": "5"})), &exact).unwrap_err(),
            "argument `n` must be an integer, got \"5\""
        );
        // What fits, null, and the other arguments are as before.
        let fits = m(json!({"s": "x", "n": null, "b": "true"}));
        let out = coerce_args(&schema(), &fits, &exact).unwrap();
        assert_eq!(
            Value::Object(out.into_owned()),
            json!({"s": "x", "n": null, "b": true})
        );
    }

    #[test]
    fn missing_required_arguments_are_named() {
        let schema = json!({"type": "object", "required": ["a", "b", "n"], "properties": {
            "a": {"type": "string"}, "b": {}, "n": {"type": ["string", "null"]}
        }});
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            missing_required(&schema, &args(json!({"a": "x", "b": 1, "n": null}))),
            None
        );
        assert_eq!(
            missing_required(&schema, &args(json!({"a": null, "b": 1, "n": "y"}))).as_deref(),
            Some("missing required argument `a`")
        );
        assert_eq!(
            missing_required(&schema, &args(json!({"n": null}))).as_deref(),
            Some("missing required arguments `a`, `b`")
        );
        assert_eq!(
            missing_required(&json!({"type": "object"}), &Map::new()),
            None
        );
    }

    #[test]
    fn impossible_values_name_the_parameter() {
        assert_eq!(
            coerce(json!({"n": "five"})).unwrap_err(),
            "argument `n` must be an integer, got \"five\""
        );
        assert_eq!(
            coerce(json!({"n": 2.5})).unwrap_err(),
            "argument `n` must be an integer, got 2.5"
        );
        // `10**20` from Python: whole, but past 64 bits.
        assert!(coerce(json!({"n": 1e20}))
            .unwrap_err()
            .ends_with("a whole number too large for a 64-bit integer"));
        assert!(coerce(json!({"b": "maybe"}))
            .unwrap_err()
            .contains("`b` must be a boolean"));
        assert!(coerce(json!({"s": {"a": 1}}))
            .unwrap_err()
            .contains("`s` must be a string"));
        assert!(coerce(json!({"u": "x"}))
            .unwrap_err()
            .contains("an integer or null"));
    }
}
