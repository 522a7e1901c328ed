//! JSON-RPC 2.0 checks the SDK does not make: which incoming messages get -32700, -32600 or
//! -32602, shared by the stdio framing and the HTTP front.

use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, JsonRpcRequest};
use serde_json::Value;

/// Methods of the MCP spec a client sends; a request for one of them that the SDK could not
/// type has malformed params.
const STANDARD_METHODS: [&str; 15] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "server/discover",
    "subscriptions/listen",
];

/// A message the client sent that JSON-RPC says to answer with an error.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// JSON-RPC error code: -32700 parse error, -32600 invalid request, -32602 invalid params.
    pub code: i32,
    /// What was wrong.
    pub message: String,
    /// The request's id when it could be read, else null.
    pub id: Value,
}

impl Rejection {
    /// The JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// What to do with one incoming message.
#[derive(Debug)]
pub enum Checked {
    /// A message for the SDK to handle.
    Message(Box<ClientJsonRpcMessage>),
    /// An unknown or malformed notification: never answered, dropped.
    Ignore,
    /// Answer with this error.
    Reject(Rejection),
}

/// The id an error reply carries for a message whose `id` member is `id`: that id when it is a
/// string or a number (what JSON-RPC allows), else null.
pub(crate) fn reply_id(id: Option<&Value>) -> Value {
    match id {
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        _ => Value::Null,
    }
}

/// The `id` of a JSON-RPC message that cannot be parsed whole (too large to keep, or with a
/// value serde_json refuses, such as a number out of range), from its first bytes (`head`) or
/// its last (`tail`). At the start the message's own members are read in order, each value
/// skipped whole, until `id` or the cut; at the end, only an `"id"` member that closes the
/// message itself counts (one closing an inner object leaves a `}` over). `None` when neither
/// holds one.
pub(crate) fn id_of_discarded(head: &[u8], tail: &[u8]) -> Option<Value> {
    from_head(head).or_else(|| from_tail(tail))
}

pub(crate) fn from_head(head: &[u8]) -> Option<Value> {
    /// Reads members until `id`, which it leaves in `found`. It then stops with an error: the
    /// rest of the message is not there, and serde_json checks the map's end after a visit.
    struct FirstId<'a>(&'a mut Option<Value>);
    impl<'de> serde::de::Visitor<'de> for FirstId<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    *self.0 = Some(map.next_value::<Value>()?);
                    return Err(serde::de::Error::custom("the id is all that is read"));
                }
                map.next_value::<serde::de::IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(head);
    let _ = serde::Deserializer::deserialize_map(&mut de, FirstId(&mut found));
    found
}

pub(crate) fn from_tail(tail: &[u8]) -> Option<Value> {
    let tail = tail.strip_suffix(b"\n").unwrap_or(tail);
    let tail = tail.strip_suffix(b"\r").unwrap_or(tail);
    let at = tail.windows(4).rposition(|w| w == b"\"id\"")?;
    let mut member = b"{".to_vec();
    member.extend_from_slice(&tail[at..]);
    let object: serde_json::Map<String, Value> = serde_json::from_slice(&member).ok()?;
    object.get("id").cloned()
}

/// Classifies one incoming message the way JSON-RPC 2.0 asks: unparsable → -32700; JSON that
/// is not a JSON-RPC message (or a batch, which MCP does not use) → -32600; a standard MCP
/// method whose params do not fit its schema → -32602 (the SDK would call it "method not
/// found", but the method exists).
pub fn check_message(text: &[u8]) -> Checked {
    // Most messages are well-formed requests: read them straight into the SDK's type. Parsing
    // into a `Value` first and then converting a deep copy of it cost a paced warm call about
    // 20 µs more (of 0.1 ms spent here after an idle gap, in cold caches). Anything the direct
    // read refuses, and a standard method whose params did not fit (the SDK then reads it as a
    // custom request), takes the classifying path below, which gives the same answer as ever.
    if let Ok(msg) = serde_json::from_slice::<ClientJsonRpcMessage>(text) {
        let standard_misread = matches!(
            &msg,
            ClientJsonRpcMessage::Request(JsonRpcRequest {
                request: ClientRequest::CustomRequest(custom),
                ..
            }) if STANDARD_METHODS.contains(&custom.method.as_str())
        );
        if !standard_misread {
            return Checked::Message(Box::new(msg));
        }
    }
    let reject =
        |code, message: String, id: Value| Checked::Reject(Rejection { code, message, id });
    let value: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        // The id when it can still be read (a number out of range in the params, say): a
        // reply with a null id is one no client can match, and the official client's call
        // then waits forever.
        Err(e) => {
            let tail = &text[text.len().saturating_sub(1024)..];
            let id = reply_id(id_of_discarded(text, tail).as_ref());
            return reject(-32700, format!("Parse error: {e}"), id);
        }
    };
    let id = reply_id(value.get("id"));
    let is_notification = value.is_object() && value.get("id").is_none();
    match serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        Ok(ClientJsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CustomRequest(custom),
            ..
        })) if STANDARD_METHODS.contains(&custom.method.as_str()) => {
            let detail = match custom.method.as_str() {
                "tools/call" => serde_json::from_value::<CallToolRequestParams>(
                    custom.params.clone().unwrap_or(Value::Null),
                )
                .err()
                .map(|e| format!(": {e}"))
                .unwrap_or_default(),
                _ => String::new(),
            };
            reject(
                -32602,
                format!(
                    "Invalid params: the params of `{}` do not match the MCP schema{detail}",
                    custom.method
                ),
                id,
            )
        }
        Ok(msg) => Checked::Message(Box::new(msg)),
        Err(_) if is_notification && value.get("method").is_some_and(Value::is_string) => {
            Checked::Ignore
        }
        // A request that reads once its params are left out (`"params": []` for tools/call):
        // the method is there, its params are what is wrong.
        Err(_) if params_to_blame(&value) => reject(
            -32602,
            format!(
                "Invalid params: the params of `{}` do not match the MCP schema (an object is \
                 expected)",
                value["method"].as_str().unwrap_or_default()
            ),
            id,
        ),
        Err(e) => {
            let message = if value.is_array() {
                "Invalid Request: batches are not supported; send one message per line".to_string()
            } else {
                format!("Invalid Request: not a JSON-RPC 2.0 message ({e})")
            };
            reject(-32600, message, id)
        }
    }
}

/// Whether `value` is a request that the SDK can read once its `params` are removed.
fn params_to_blame(value: &Value) -> bool {
    let Some(object) = value.as_object() else {
        return false;
    };
    if !object.contains_key("params") || reply_id(object.get("id")).is_null() {
        return false;
    }
    let mut without = object.clone();
    without.remove("params");
    matches!(
        serde_json::from_value::<ClientJsonRpcMessage>(Value::Object(without)),
        Ok(ClientJsonRpcMessage::Request(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_call_is_read_as_the_sdk_reads_it_through_a_value() {
        let texts = [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"print(1)","timeout":5},"_meta":{"progressToken":"p1"}}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"execute_code","arguments":{"code":"print(1)","code":"print(2)"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#,
            r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#,
        ];
        for text in texts {
            let Checked::Message(msg) = check_message(text.as_bytes()) else {
                panic!("{text}: not read as a message");
            };
            let through_value: ClientJsonRpcMessage =
                serde_json::from_value(serde_json::from_str::<Value>(text).unwrap()).unwrap();
            assert_eq!(
                serde_json::to_value(&*msg).unwrap(),
                serde_json::to_value(&through_value).unwrap(),
                "{text}"
            );
        }
    }

    fn rejection(text: &str) -> Rejection {
        match check_message(text.as_bytes()) {
            Checked::Reject(r) => r,
            other => panic!("{text}: expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn messages_are_classified_as_json_rpc_asks() {
        assert_eq!(rejection("{oops").code, -32700);
        assert_eq!(rejection("{oops").id, Value::Null);
        // A number serde_json cannot hold, after the id or before it at the end.
        let big = format!("1{}", "0".repeat(400));
        let r = rejection(&format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"n":{big}}}}}"#
        ));
        assert_eq!(
            (r.code, r.id.clone()),
            (-32700, serde_json::json!(7)),
            "{}",
            r.message
        );
        let r = rejection(&format!(
            r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"n":{big}}},"id":"q"}}"#
        ));
        assert_eq!((r.code, r.id), (-32700, serde_json::json!("q")));
        assert_eq!(rejection("{\"a\":1}").code, -32600);
        assert_eq!(rejection("[]").code, -32600);
        assert_eq!(rejection("42").code, -32600);
        let r = rejection(
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"execute_code","arguments":[1]}}"#,
        );
        assert_eq!((r.code, r.id.clone()), (-32602, Value::from("x")));
        assert!(r.message.contains("tools/call"), "{}", r.message);
        // Params that are not an object at all (probe of stop 55: -32600).
        for params in ["[]", "5", "\"x\""] {
            let r = rejection(&format!(
                r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{params}}}"#
            ));
            assert_eq!((r.code, r.id.clone()), (-32602, Value::from(4)), "{params}");
            assert!(r.message.contains("tools/call"), "{}", r.message);
        }
        // Not a JSON-RPC 2.0 request without its params either: nothing to blame on them.
        assert_eq!(
            rejection(r#"{"jsonrpc":"1.0","id":4,"method":"tools/call","params":[]}"#).code,
            -32600
        );
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":5}"#),
            Checked::Ignore | Checked::Message(_)
        ));
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Checked::Message(_)
        ));
        // An unknown method is the SDK's to answer (-32601), with the request's id.
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#),
            Checked::Message(_)
        ));
    }
}
