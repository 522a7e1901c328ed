//! Built-in tools, one file each. Each file registers its tool with `inventory::submit!`;
//! adding a tool touches no list here beyond its `mod` line.

mod agent_loop;
pub mod args;
mod file_lock;
mod file_open;
mod patch;
mod process;
mod read_file;
mod search_files;
pub mod terminal;
mod typed_line;
mod web;
mod web_text;
mod write_file;
