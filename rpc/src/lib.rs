//! The execute_code RPC channel, seen from both ends.
//!
//! A script talks to the supervisor over a Unix socket with newline-delimited JSON: one request
//! `{"id", "tool", "args", "token"}` and one response `{"id", "result"}` per tool call. This crate
//! owns that wire format ([`protocol`]) and the Python module that speaks it from inside the
//! script ([`stub`], which generates `vibeos_tools.py` from tool schemas).
//!
//! It knows nothing of the registry or of the supervisor: both ends depend on it, so the format
//! has exactly one definition.

pub mod protocol;
pub mod stub;

pub use protocol::{
    decode_request, encode_error, encode_response, encode_response_json, ProtocolError, Request,
    MAX_FRAME_BYTES, MAX_FRAME_VALUES,
};
pub use stub::{
    check_tool_name, doc_line, generate_stub, signature_text, stub_function, GeneratedStub,
    StubError, StubParam, StubTool, RUNTIME_FILE, RUNTIME_MODULE, RUNTIME_SOURCE,
};
