//! Built-in tools, one file each. Each file registers its tool with `inventory::submit!`;
//! adding a tool touches no list here beyond its `mod` line.

pub mod args;
mod process;
mod patch;
mod read_file;
mod search_files;
mod web;
pub mod terminal;
mod write_file;
