//! One module per area; see each module's docs.

#[macro_use]
mod common;
mod execute_code_tool;
mod pool;
mod prestart;
mod rpc_pace;
mod script_start;
mod status_report;
mod structure;
mod stub_channel;
mod zygote;
