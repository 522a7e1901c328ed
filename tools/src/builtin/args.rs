//! Built-in tools' arguments: one typed struct per tool (serde + schemars) gives both the JSON
//! schema offered to the model ([`schema_for`]) and the parser of a call ([`parse`]), so the two
//! cannot drift; errors name the argument.

use crate::ToolError;
use serde_json::{Map, Value};

/// The JSON schema of a tool's typed arguments, as offered to the model: generated from the
/// same struct the handler deserializes ([`parse`]), so the two cannot drift. Generator noise
/// the model does not need (`$schema`, `title`, integer `format`, `null` in the type of an
/// optional argument) is left out; names, types, `required`, descriptions, defaults, bounds and
/// enums stay.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.meta_schema = None;
    settings.inline_subschemas = true;
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    tidy(&mut schema);
    // The struct's own doc comment is for readers of the code; the model gets the tool's
    // description instead.
    if let Some(map) = schema.as_object_mut() {
        map.remove("description");
        // The parser refuses unknown arguments itself, with the names the tool takes; the
        // published schema stays as it was (`additionalProperties` comes from
        // `deny_unknown_fields`).
        map.remove("additionalProperties");
    }
    schema
}

fn tidy(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for noise in ["$schema", "title", "format"] {
                map.remove(noise);
            }
            if let Some(Value::Array(types)) = map.get("type") {
                let real: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if real.len() == 1 {
                    map.insert("type".into(), real[0].clone());
                }
            }
            if map.get("default") == Some(&Value::Null) {
                map.remove("default");
            }
            // An optional enum argument comes out as `enum: [..., null]`.
            if let Some(Value::Array(options)) = map.get_mut("enum") {
                options.retain(|o| !o.is_null());
            }
            for (_, child) in map.iter_mut() {
                tidy(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Deserializes a call's arguments into the tool's typed arguments. `null` counts as absent
/// (models send it for "not given"). An argument the tool does not take is refused with the
/// names it does take (the argument structs deny unknown fields): ignored, a misspelled
/// `glob` for `file_glob` searched every file without a word. Errors name the argument.
pub fn parse<T: serde::de::DeserializeOwned>(args: &Map<String, Value>) -> Result<T, ToolError> {
    // Read in place when nothing is null (the usual call), without first copying every
    // argument (about 0.1 us of a 5 us `read_file` in the supervisor).
    let parsed = if args.values().any(Value::is_null) {
        let present: Map<String, Value> = args
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_path_to_error::deserialize(Value::Object(present))
    } else {
        serde_path_to_error::deserialize(args)
    };
    parsed.map_err(|e| {
        let inner = e.inner().to_string();
        let path = e.path().to_string();
        if let Some(rest) = inner.strip_prefix("unknown field ") {
            // serde: "unknown field `glob`, expected one of `pattern`, `target`, ..."
            // ... or, for a tool without arguments, "unknown field `x`, there are no fields".
            let (name, known) = rest
                .split_once(", expected ")
                .or_else(|| rest.split_once(", "))
                .unwrap_or((rest, ""));
            // serde lists two fields as "`a` or `b`": the tool takes both.
            let known = match known.strip_prefix("one of ") {
                Some(list) => list.to_string(),
                None if known == "there are no fields" => "no arguments".to_string(),
                None => known.replacen("` or `", "` and `", 1),
            };
            return ToolError::invalid_args(format!(
                "unknown argument {name}; the tool takes {known}"
            ));
        }
        match inner.strip_prefix("missing field ") {
            Some(field) => ToolError::invalid_args(format!("missing required argument {field}")),
            None if path == "." => ToolError::invalid_args(inner),
            None => ToolError::invalid_args(format!("argument `{path}`: {inner}")),
        }
    })
}

/// `value` of argument `name` if within `[min, max]`.
pub fn in_range(name: &str, value: i64, min: i64, max: i64) -> Result<i64, ToolError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ToolError::invalid_args(format!(
            "argument `{name}` must be between {min} and {max}, got {value}"
        )))
    }
}

/// Refuses a path a filesystem call cannot take (empty, NUL bytes).
pub fn check_path<'a>(name: &str, path: &'a str) -> Result<&'a str, ToolError> {
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

/// Checks the JSON schema a tool offers against the schema its typed arguments generate and
/// the example arguments it documents: the example parses, a wrong type is refused.
#[cfg(test)]
pub fn assert_schema_and_parser_agree<T: schemars::JsonSchema + serde::de::DeserializeOwned>(
    offered: &Value,
    expected_before: Value,
    example: Value,
    wrong_type: Value,
) {
    assert_eq!(
        offered,
        &schema_for::<T>(),
        "the entry must offer the generated schema"
    );
    assert_eq!(
        offered, &expected_before,
        "the schema's observable content changed:\n{offered:#}\nvs\n{expected_before:#}"
    );
    let example = example.as_object().cloned().unwrap_or_default();
    if let Err(e) = parse::<T>(&example) {
        panic!("the documented example does not parse: {e}");
    }
    let wrong = wrong_type.as_object().cloned().unwrap_or_default();
    match parse::<T>(&wrong) {
        Ok(_) => panic!("a wrong type was accepted: {wrong_type}"),
        Err(e) => assert_eq!(e.kind, crate::ToolErrorKind::InvalidArguments, "{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;
    use serde_json::{json, Map, Value};

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read by the parser only
    struct Two {
        path: String,
        content: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct None_ {}

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    /// serde names two fields "`path` or `content`", which read as if the tool took either.
    #[test]
    fn an_unknown_argument_is_told_every_argument_the_tool_takes() {
        let e = parse::<Two>(&args(json!({"path": "a", "content": "b", "bogus": 1})))
            .expect_err("an unknown argument is refused");
        assert_eq!(
            e.message,
            "unknown argument `bogus`; the tool takes `path` and `content`"
        );
        let e = parse::<None_>(&args(json!({"bogus": 1}))).expect_err("refused");
        assert_eq!(
            e.message,
            "unknown argument `bogus`; the tool takes no arguments"
        );
    }
}
