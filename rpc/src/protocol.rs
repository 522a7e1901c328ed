//! Frames of the RPC channel: decoding requests, encoding replies.
//!
//! Every frame is one JSON object on one line. The supervisor reads frames of at most
//! [`MAX_FRAME_BYTES`]; anything it cannot accept is answered with an error frame
//! (`{"id": …, "error": {"code", "message"}}`) so a script always learns why, and nothing a
//! script sends can crash or stall the reader.

use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Largest frame (one line, without its newline) the supervisor accepts: 16 MiB.
///
/// Large enough for `write_file` of a sizeable file, small enough that a runaway script cannot
/// make the supervisor buffer without bound.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Most JSON values (arrays, objects and their elements) a frame may hold.
///
/// A parsed value takes tens of bytes of the supervisor's memory however few bytes it took on
/// the wire: a frame of 5.5 million empty arrays (`[[],[],…]`, 15 MB) parsed into about 400 MB,
/// and executions side by side multiply that. Real arguments are a few values, or a long
/// string (which costs its own length); a quarter of a million values is far past any call
/// and bounds a frame's parse to about 25 MB.
pub const MAX_FRAME_VALUES: usize = 250_000;

/// One tool call sent by a script.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Caller-chosen id (number or string) echoed in the reply; lets calls be in flight at once.
    pub id: Value,
    /// Name of the tool to call.
    pub tool: String,
    /// Keyword arguments of the call (always an object).
    pub args: Map<String, Value>,
    /// The execution's RPC token; a request without the right one is refused.
    pub token: String,
}

/// Why a frame was refused. The `code` strings are part of the wire format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame is not valid JSON.
    #[error("request is not valid JSON: {0}")]
    NotJson(String),
    /// The frame is JSON but not an object.
    #[error("request must be a JSON object with id, tool, args and token")]
    NotObject,
    /// A required field is missing or has the wrong type.
    #[error("request field `{field}` is missing or not {expected}")]
    BadField {
        /// Name of the offending field.
        field: &'static str,
        /// What the field should have been.
        expected: &'static str,
    },
    /// The frame is longer than [`MAX_FRAME_BYTES`].
    #[error("request is larger than the {limit}-byte frame limit; pass large data through files")]
    TooLarge {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The frame holds more values than [`MAX_FRAME_VALUES`].
    #[error(
        "request holds more than {limit} JSON values (arrays, objects, elements); pass large \
         data through files"
    )]
    TooManyValues {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The token does not match this execution's.
    #[error("request token is wrong; only the script of this execution may call tools")]
    BadToken,
    /// The connecting process is not part of this execution.
    #[error("connection refused: the peer is not a process of this execution")]
    ForeignPeer,
    /// The execution already has as many open connections as it may.
    #[error(
        "connection refused: this execution already has {limit} open RPC connections; \
         close unused ones (threads of one process can share a connection)"
    )]
    TooManyConnections {
        /// The per-execution limit.
        limit: usize,
    },
    /// The supervisor failed on its side (say, it could not read the peer's credentials): not
    /// the peer's fault, and not a verdict on who it is.
    #[error("internal error of the supervisor: {0}")]
    Internal(String),
}

impl ProtocolError {
    /// Stable machine-readable code of the error.
    pub fn code(&self) -> &'static str {
        match self {
            ProtocolError::NotJson(_) => "invalid_json",
            ProtocolError::NotObject => "invalid_request",
            ProtocolError::BadField { .. } => "invalid_request",
            ProtocolError::TooLarge { .. } => "frame_too_large",
            ProtocolError::TooManyValues { .. } => "frame_too_complex",
            ProtocolError::BadToken => "unauthorized",
            ProtocolError::ForeignPeer => "unauthorized",
            ProtocolError::TooManyConnections { .. } => "too_many_connections",
            ProtocolError::Internal(_) => "internal_error",
        }
    }

    /// Whether the connection should be closed after replying (the peer cannot be trusted or
    /// the stream can no longer be framed).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ProtocolError::BadToken
                | ProtocolError::ForeignPeer
                | ProtocolError::TooLarge { .. }
                | ProtocolError::TooManyConnections { .. }
                | ProtocolError::Internal(_)
        )
    }
}

#[derive(Deserialize)]
struct RawRequest {
    id: Option<Value>,
    tool: Option<Value>,
    args: Option<Value>,
    token: Option<Value>,
}

/// Decodes one frame (without its trailing newline) into a [`Request`].
///
/// On failure it also returns the request id when one could be read, so the error reply can be
/// matched to the waiting call.
pub fn decode_request(frame: &[u8]) -> Result<Request, (Option<Value>, ProtocolError)> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err((
            None,
            ProtocolError::TooLarge {
                limit: MAX_FRAME_BYTES,
            },
        ));
    }
    if holds_more_values_than(frame, MAX_FRAME_VALUES) {
        return Err((
            None,
            ProtocolError::TooManyValues {
                limit: MAX_FRAME_VALUES,
            },
        ));
    }
    // One pass straight into the request's fields. serde's error category tells "not JSON"
    // (syntax, invalid UTF-8 in a string, nesting past the recursion limit, truncation) from
    // "JSON, but not a request object" (a data error). A derived struct would also accept a
    // JSON array of its fields in order; the protocol says object, so that is refused too.
    let raw: RawRequest = match serde_json::from_slice(frame) {
        Ok(raw) if frame.trim_ascii_start().starts_with(b"{") => raw,
        Ok(_) => return Err((None, ProtocolError::NotObject)),
        Err(e) => {
            return Err((
                None,
                match e.classify() {
                    serde_json::error::Category::Data => ProtocolError::NotObject,
                    _ => ProtocolError::NotJson(e.to_string()),
                },
            ))
        }
    };
    let id = match raw.id {
        Some(id @ (Value::Number(_) | Value::String(_))) => id,
        _ => {
            return Err((
                None,
                ProtocolError::BadField {
                    field: "id",
                    expected: "a number or string",
                },
            ))
        }
    };
    let bad = |field, expected| {
        Err((
            Some(id.clone()),
            ProtocolError::BadField { field, expected },
        ))
    };
    let token = match raw.token {
        Some(Value::String(t)) => t,
        _ => return bad("token", "a string"),
    };
    let tool = match raw.tool {
        Some(Value::String(t)) => t,
        _ => return bad("tool", "a string"),
    };
    let args = match raw.args {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return bad("args", "an object"),
    };
    Ok(Request {
        id,
        tool,
        args,
        token,
    })
}

/// Whether `frame` holds more than `limit` JSON values, counted before anything is parsed: an
/// array or object opening, or an element or member after a comma, outside strings. A frame no
/// longer than `limit` cannot hold more, so the usual small frame is not scanned at all.
fn holds_more_values_than(frame: &[u8], limit: usize) -> bool {
    if frame.len() <= limit {
        return false;
    }
    let mut count = 0usize;
    let mut i = 0;
    while i < frame.len() {
        match frame[i] {
            b'"' => {
                // Skip the string: to the next quote that no backslash escapes.
                i += 1;
                while i < frame.len() {
                    match frame[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
            }
            b'[' | b'{' | b',' => {
                count += 1;
                if count > limit {
                    return true;
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// Encodes the reply to a call as one line (with its newline).
pub fn encode_response(id: &Value, result: &Value) -> Vec<u8> {
    frame(&json!({ "id": id, "result": result }))
}

/// Encodes the reply to a call whose result is already JSON text (as the registry returns it),
/// without parsing and re-serialising it. Text that is not valid JSON is sent as a string.
/// Line breaks in the text (a host tool that returns `json.dumps(x, indent=2)`) would end the
/// frame early; in valid JSON they can only be whitespace between tokens (inside a string
/// they must be escaped), so each becomes a space and nothing else of the text changes.
pub fn encode_response_json(id: &Value, result_json: &str) -> Vec<u8> {
    match serde_json::from_str::<&serde_json::value::RawValue>(result_json) {
        Ok(raw) => {
            let id = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
            let mut out = Vec::with_capacity(raw.get().len() + id.len() + 20);
            out.extend_from_slice(b"{\"id\":");
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(b",\"result\":");
            out.extend(
                raw.get()
                    .bytes()
                    .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
            );
            out.extend_from_slice(b"}\n");
            out
        }
        Err(_) => encode_response(id, &Value::String(result_json.to_string())),
    }
}

/// Encodes a protocol error reply as one line (with its newline).
pub fn encode_error(id: Option<&Value>, error: &ProtocolError) -> Vec<u8> {
    frame(&json!({
        "id": id.cloned().unwrap_or(Value::Null),
        "error": { "code": error.code(), "message": error.to_string() },
    }))
}

fn frame(value: &Value) -> Vec<u8> {
    // Serialising a `Value` cannot fail: keys are strings and there are no foreign types.
    let mut out = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pretty_printed_result_is_sent_as_one_line_with_its_value_intact() {
        let text =
            "{\n  \"a\": 1,\r\n  \"b\": [\n    \"x\\ny\",\n    12345678901234567890123\n  ]\n}\n";
        let frame = encode_response_json(&json!(3), text);
        let line = String::from_utf8(frame).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.ends_with('\n'));
        let back: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(back["id"], json!(3));
        assert_eq!(back["result"]["b"][0], json!("x\ny"));
        // The big number travels as written, not rounded through a float.
        assert!(line.contains("12345678901234567890123"), "{line}");
    }

    #[test]
    fn decodes_a_well_formed_request() {
        let r = decode_request(br#"{"id":7,"tool":"read_file","args":{"path":"a"},"token":"t"}"#)
            .map_err(|e| e.1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.id, json!(7));
        assert_eq!(r.tool, "read_file");
        assert_eq!(r.args.get("path"), Some(&json!("a")));
        assert_eq!(r.token, "t");
    }

    #[test]
    fn refuses_garbage_with_a_reason() {
        let (id, e) = decode_request(b"not json").err().unwrap_or_default_pair();
        assert_eq!(id, None);
        assert_eq!(e.code(), "invalid_json");
        let (_, e) = decode_request(b"[1,2]").err().unwrap_or_default_pair();
        assert_eq!(e, ProtocolError::NotObject);
        let (_, e) = decode_request(br#"[1,"read_file",{},"t"]"#)
            .err()
            .unwrap_or_default_pair();
        assert_eq!(e, ProtocolError::NotObject);
    }

    #[test]
    fn broken_json_inside_an_object_is_invalid_json_not_invalid_request() {
        // Invalid UTF-8 inside a string value.
        let (_, e) =
            decode_request(b"{\"id\":1,\"tool\":\"x\xff\xfe\",\"args\":{},\"token\":\"t\"}")
                .err()
                .unwrap_or_default_pair();
        assert_eq!(e.code(), "invalid_json", "{e}");
        // Nesting far past serde_json's recursion limit, inside an object and at the top.
        let deep = format!(
            "{{\"id\":1,\"tool\":\"x\",\"args\":{{\"a\":{}{}}},\"token\":\"t\"}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let (_, e) = decode_request(deep.as_bytes())
            .err()
            .unwrap_or_default_pair();
        assert_eq!(e.code(), "invalid_json", "{e}");
        let (_, e) = decode_request("[".repeat(100_000).as_bytes())
            .err()
            .unwrap_or_default_pair();
        assert_eq!(e.code(), "invalid_json", "{e}");
        let (id, e) = decode_request(br#"{"id":"x","tool":3,"token":"t"}"#)
            .err()
            .unwrap_or_default_pair();
        assert_eq!(id, Some(json!("x")));
        assert_eq!(
            e,
            ProtocolError::BadField {
                field: "tool",
                expected: "a string"
            }
        );
        let (_, e) = decode_request(br#"{"id":1,"tool":"x","args":[],"token":"t"}"#)
            .err()
            .unwrap_or_default_pair();
        assert_eq!(
            e,
            ProtocolError::BadField {
                field: "args",
                expected: "an object"
            }
        );
    }

    #[test]
    fn refuses_oversized_frames() {
        let big = vec![b' '; MAX_FRAME_BYTES + 1];
        let (_, e) = decode_request(&big).err().unwrap_or_default_pair();
        assert!(e.closes_connection());
        assert_eq!(e.code(), "frame_too_large");
    }

    #[test]
    fn refuses_frames_of_too_many_values_before_parsing_them() {
        let frame = |inner: &str| {
            format!(r#"{{"id":1,"tool":"read_file","args":{{"path":[{inner}]}},"token":"t"}}"#)
        };
        let many = vec!["[]"; MAX_FRAME_VALUES].join(",");
        let (_, e) = decode_request(frame(&many).as_bytes())
            .err()
            .unwrap_or_default_pair();
        assert_eq!(e.code(), "frame_too_complex");
        assert!(!e.closes_connection());
        // Just under the limit: parsed (and left to the tool to judge).
        let fewer = vec!["[]"; MAX_FRAME_VALUES / 2 - 4].join(",");
        assert!(decode_request(frame(&fewer).as_bytes()).is_ok());
        // Commas, brackets, quotes and escapes inside a string are not values.
        let text = "[{,\\\"],".repeat(MAX_FRAME_VALUES);
        let line = format!(
            r#"{{"id":1,"tool":"write_file","args":{{"path":"a","content":"{text}"}},"token":"t"}}"#
        );
        let req = decode_request(line.as_bytes()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            req.args["content"].as_str().map(str::len),
            Some(6 * MAX_FRAME_VALUES)
        );
    }

    #[test]
    fn raw_results_are_embedded_as_is() {
        let line = encode_response_json(&json!("a"), r#"{"x": [1, 2]}"#);
        let v: Value = serde_json::from_slice(&line).unwrap_or_default();
        assert_eq!(v, json!({"id": "a", "result": {"x": [1, 2]}}));
        let line = encode_response_json(&json!(1), "not json");
        let v: Value = serde_json::from_slice(&line).unwrap_or_default();
        assert_eq!(v["result"], "not json");
    }

    #[test]
    fn replies_are_single_lines() {
        let line = encode_response(&json!(1), &json!({"a": "b\nc"}));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
        let err = encode_error(None, &ProtocolError::BadToken);
        let v: Value = serde_json::from_slice(&err).unwrap_or_default();
        assert_eq!(v["error"]["code"], "unauthorized");
        assert_eq!(v["id"], Value::Null);
    }

    trait OrDefaultPair {
        fn unwrap_or_default_pair(self) -> (Option<Value>, ProtocolError);
    }
    impl OrDefaultPair for Option<(Option<Value>, ProtocolError)> {
        fn unwrap_or_default_pair(self) -> (Option<Value>, ProtocolError) {
            match self {
                Some(p) => p,
                None => panic!("expected a protocol error"),
            }
        }
    }
}
