//! Reading typed arguments out of a call's argument object, with errors that name the parameter.

use crate::ToolError;
use serde_json::{Map, Value};

/// A required string argument.
pub fn required_str<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ToolError::invalid_args(format!(
            "missing required argument `{name}`"
        ))),
        Some(other) => Err(ToolError::invalid_args(format!(
            "argument `{name}` must be a string, got {other}"
        ))),
    }
}

/// An optional string argument.
pub fn optional_str<'a>(
    args: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolError::invalid_args(format!(
            "argument `{name}` must be a string, got {other}"
        ))),
    }
}

/// An optional integer argument within `[min, max]`, `default` when absent. Integral strings
/// ("5") are accepted, as models often send them.
pub fn int_in_range(
    args: &Map<String, Value>,
    name: &str,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ToolError> {
    let value = match args.get(name) {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::Number(n)) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(_) => None,
    };
    match value {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        Some(v) => Err(ToolError::invalid_args(format!(
            "argument `{name}` must be between {min} and {max}, got {v}"
        ))),
        None => Err(ToolError::invalid_args(format!(
            "argument `{name}` must be an integer, got {}",
            args.get(name).map(Value::to_string).unwrap_or_default()
        ))),
    }
}

/// Refuses paths a filesystem call cannot take (NUL bytes, empty).
pub fn checked_path<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolError> {
    let path = required_str(args, name)?;
    if path.is_empty() {
        return Err(ToolError::invalid_args(format!(
            "argument `{name}` is empty"
        )));
    }
    if path.contains('\0') {
        return Err(ToolError::invalid_args(format!(
            "argument `{name}` contains a NUL byte, which no path can hold"
        )));
    }
    Ok(path)
}
