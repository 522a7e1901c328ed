//! `vibeos-link-order`: keeps `cli/link-order.txt`, the list of functions a cold `vibeos-exec
//! run` executes, in the order it first executes them.
//!
//! Why it exists: on the 2-core VMs this project is measured on, mapping a page costs about
//! half a microsecond even when it is in the page cache, and a cold `run` used to touch code
//! spread over 8 MB of the binary's 18 MB of `.text` (the kernel maps 64 KB around each fault).
//! `cli/build.rs` hands the list to the linker (`lld --symbol-ordering-file`), which places
//! those functions first and together, so the same run maps about 1 MB of code
//! (docs/cold-start.md, "Stop 34").
//!
//! `record` runs a command under `ptrace`, single-stepping the process and every thread and
//! process it starts until they execute another program (the interpreter a run starts is let
//! go at its exec), and maps each instruction executed inside the binary to the function
//! symbol that holds it. `check` tells how much of a list a built binary still has: symbol
//! names carry a hash of the crate's build metadata, so a toolchain or dependency update makes
//! a list stale (the linker then skips the names it does not find, and the run is only slower).

mod list;
mod symbols;
mod trace;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Errors of the link-order tool; each says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum LinkOrderError {
    /// The binary could not be read.
    #[error("cannot read the binary {path}: {source}")]
    ReadBinary {
        /// The binary named by `--binary`.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The binary is not an ELF file with a symbol table.
    #[error("{path} is not an ELF binary with a symbol table ({reason}); build it with `cargo build --release -p vibeos-cli` and do not strip it")]
    ParseBinary {
        /// The binary named by `--binary`.
        path: PathBuf,
        /// What the parser reported.
        reason: String,
    },
    /// The command to trace could not be started.
    #[error("cannot trace `{command}`: {reason}")]
    Spawn {
        /// The command line.
        command: String,
        /// What failed.
        reason: String,
    },
    /// A `ptrace` or `waitpid` call failed while tracing.
    #[error("tracing failed at {step}: {source}; the tool needs ptrace rights over its children (root, or kernel.yama.ptrace_scope 0 or 1)")]
    Trace {
        /// The step that failed.
        step: &'static str,
        /// The error the kernel returned.
        source: nix::errno::Errno,
    },
    /// The traced command never ran the binary.
    #[error("the traced command never executed {binary}; pass the binary the command runs")]
    NeverRan {
        /// The binary named by `--binary`.
        binary: PathBuf,
    },
    /// The list file could not be read or written.
    #[error("cannot {action} the list {path}: {source}")]
    List {
        /// "read" or "write".
        action: &'static str,
        /// The list file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Parser)]
#[command(
    name = "vibeos-link-order",
    about = "Record or check the function order the vibeos-exec binary is linked with"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command under ptrace and write the functions of BINARY it executes, in the order
    /// they first run.
    Record {
        /// The binary whose functions are recorded (the command must execute it).
        #[arg(long)]
        binary: PathBuf,
        /// The list file to write.
        #[arg(long)]
        list: PathBuf,
        /// Keep the functions already in the list first and add the new ones after them.
        #[arg(long)]
        append: bool,
        /// The command to trace and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print how many of the listed functions BINARY still has; fail below --min-share.
    Check {
        /// The binary to check against.
        #[arg(long)]
        binary: PathBuf,
        /// The list file.
        #[arg(long)]
        list: PathBuf,
        /// The share (0 to 1) of listed functions that must be found.
        #[arg(long, default_value_t = 0.9, value_parser = share)]
        min_share: f64,
    },
}

/// Parses a share: a number from 0 to 1.
fn share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number; give a share from 0 to 1, like 0.9"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!(
            "{value} is not a share; give a number from 0 to 1, like 0.9"
        ))
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("vibeos-link-order: {error}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, LinkOrderError> {
    match cli.command {
        Command::Record {
            binary,
            list,
            append,
            command,
        } => {
            let table = symbols::FunctionTable::load(&binary)?;
            let executed = trace::functions_executed(&binary, &table, &command)?;
            let mut names = if append {
                list::read(&list)?
            } else {
                Vec::new()
            };
            let before = names.len();
            for index in executed {
                let name = table.name(index);
                if !names.iter().any(|known| known == name) {
                    names.push(name.to_owned());
                }
            }
            list::write(&list, &names)?;
            eprintln!(
                "{}: {} functions ({} new from `{}`)",
                list.display(),
                names.len(),
                names.len() - before,
                command.join(" ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            binary,
            list,
            min_share,
        } => {
            let table = symbols::FunctionTable::load(&binary)?;
            let names = list::read(&list)?;
            let present: HashSet<&str> = table.names().collect();
            let found = names
                .iter()
                .filter(|name| present.contains(name.as_str()))
                .count();
            let share = if names.is_empty() {
                0.0
            } else {
                found as f64 / names.len() as f64
            };
            println!(
                "{found} of {} listed functions are in {} ({:.1}%)",
                names.len(),
                binary.display(),
                share * 100.0
            );
            if share < min_share {
                eprintln!(
                    "the list is stale: regenerate it with scripts/update-link-order (a cold run maps more code until then)"
                );
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
