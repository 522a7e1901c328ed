//! Built-in tools, one file each. Each file registers its tool with `inventory::submit!`;
//! adding a tool touches no list here beyond its `mod` line.

pub mod args;
mod read_file;
mod write_file;
