//! One module per area; see each module's docs.

mod execute_code_tool;
mod pool;
mod zygote;
