//! `vibeos-exec`: the command-line face of execute_code.
//!
//! Exit codes of `run` (without `--json` they are the only status signal): 0 success, 1 error,
//! 124 timeout, 130 interrupted, 2 usage or config error.
//!
//! The process starts at [`main`] below rather than at std's: see `process_start`.

#![no_main]

mod early_signals;
mod process_start;

use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use vibeos_supervisor::backends;
use vibeos_supervisor::overrides::{Overrides, Requested, Spelling};
use vibeos_supervisor::{
    audit, execute, execute_code_tool, logging, Config, ExecutionRequest, Interrupt,
};
use vibeos_tools::environments::BackendSettings;

/// Run Python scripts that call the agent's tools, sandboxed and bounded.
#[derive(Parser, Debug)]
#[command(
    name = "vibeos-exec",
    version,
    about = "Run Python scripts that call the agent's tools over a private RPC channel, scrubbed, confined and bounded."
)]
struct Cli {
    /// Log level for stderr and $VIBEOS_HOME/logs/agent.log: error, warn, info, debug, trace or
    /// off (or a tracing filter, e.g. vibeos_tools=debug).
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Config file (default: $VIBEOS_HOME/config.yaml, else ~/.vibeos/config.yaml).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a script (a file, or - for stdin) and print what it printed.
    #[command(
        after_help = "Exit codes: 0 success, 1 error, 124 timeout, 130 interrupted (SIGINT/SIGTERM), 2 usage or config error.\nWith --json, stdout holds exactly one result object: status, output, tool_calls_made, duration_seconds, exit_code, error, truncation figures."
    )]
    Run(RunArgs),
    /// Inspect the environment policy.
    Env {
        #[command(subcommand)]
        command: EnvCommand,
    },
    /// Serve execute_code to MCP clients (stdio by default, or streamable HTTP on loopback).
    #[command(long_about = SERVE_ABOUT)]
    Serve(ServeArgs),
    /// Inspect the tool registry: what the model would get.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Show what this machine supports (landlock, seccomp, namespaces, cgroups, root), what
    /// each mode enforces here, and each backend: configured or not, reachable or why not.
    Doctor {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Manage execution backends (containers and hosts scripts run in).
    Backends {
        #[command(subcommand)]
        command: BackendsCommand,
    },
    /// Internal: the tool agent a remote backend runs (JSON lines on stdin/stdout).
    #[command(hide = true)]
    BackendAgent {
        /// Run every command without shell-session state.
        #[arg(long)]
        no_shell_session: bool,
        /// Serve on this Unix socket (token first on stdin; stdin is then the lifeline).
        #[arg(long, value_name = "PATH")]
        listen: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum BackendsCommand {
    /// Remove containers, and Modal and Daytona sandboxes when those are configured, labelled
    /// vibeos-exec=1 whose owning process is gone (a crashed host).
    Gc {
        /// Also remove persistent containers (terminal.container_persistent) that no running
        /// host is using.
        #[arg(long)]
        all: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ToolsCommand {
    /// Table of the selected tools: name, toolset, available or why not, emoji.
    List(ListArgs),
    /// The JSON array of function-calling schemas the model would get (always JSON: it takes
    /// no --json).
    Schema(ToolsArgs),
}

/// The toolset selection of `tools list` and `tools schema`.
#[derive(Args, Debug)]
struct ToolsArgs {
    /// Only these toolsets (comma-separated; composites, presets and legacy names accepted).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    enable_toolsets: Vec<String>,
    /// All toolsets except these (comma-separated).
    #[arg(long, value_name = "C,D", value_delimiter = ',')]
    disable_toolsets: Vec<String>,
}

/// `tools list`: the selection, and the output format. `tools schema` has no `--json`: its
/// output is JSON already, and a flag it accepted and ignored would look like it did something.
#[derive(Args, Debug)]
struct ListArgs {
    #[command(flatten)]
    selection: ToolsArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Script file, or - to read it from stdin.
    file: String,
    #[command(flatten)]
    limits: LimitArgs,
    /// Print exactly one JSON result object on stdout.
    #[arg(long)]
    json: bool,
}

const SERVE_ABOUT: &str = "Serve execute_code over the Model Context Protocol.

By default the server speaks MCP on stdin/stdout (register it with a client as the command
`vibeos-exec serve`); with --http it serves streamable HTTP at http://ADDR/mcp on a loopback
address only. Tools offered: execute_code (its description lists the script tools available now
and the limits below), plus the tools of --toolsets.

--config, --mode, --timeout, --max-tool-calls and --cwd work exactly as for `run` and are the
defaults of every call. A call's arguments may override `timeout`, `max_tool_calls`,
`stdout_limit` and `stderr_limit` (the execute_code schema offers them); `mode` and `cwd` are the server's and cannot be changed per
call, so a client cannot loosen strict mode. In strict mode the tools of --toolsets follow a
strict script's rules: the file tools act only beneath the session dir and
code_execution.strict.read_roots/write_roots, and terminal and process are offered only with
code_execution.strict.terminal: true.

Up to --max-concurrent executions run at once; further calls wait in a queue. Clients that send
a progressToken get notifications/progress while a call is queued and while it runs.
notifications/cancelled interrupts the execution (status `interrupted`); a client that
disconnects has all its running executions interrupted and cleaned up.";

#[derive(Args, Debug)]
struct ServeArgs {
    /// Serve streamable HTTP on this loopback address (127.0.0.1:PORT, [::1]:PORT,
    /// localhost:PORT; port 0 picks one) instead of stdio. Non-loopback addresses are refused.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Also offer the registry's tools of these toolsets (comma-separated; `mcp-NAME` for the
    /// tools of the configured MCP server NAME). In strict mode only those strict mode
    /// confines are offered.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    toolsets: Vec<String>,
    /// Executions running at once; further calls are queued.
    #[arg(long, value_name = "N", default_value_t = 4)]
    max_concurrent: usize,
    /// Largest request accepted, in bytes (one stdio line or one HTTP body).
    #[arg(long, value_name = "BYTES", default_value_t = vibeos_mcp_server::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// HTTP sessions open at once; a new client beyond it gets 503 until a session ends
    /// (closed by its client, or idle for 5 minutes).
    #[arg(long, value_name = "N", default_value_t = vibeos_mcp_server::DEFAULT_MAX_SESSIONS)]
    max_sessions: usize,
    /// Defaults of every call.
    #[command(flatten)]
    limits: LimitArgs,
}

/// Mode, limits and session dir, as `run` and `serve` take them.
#[derive(Args, Debug)]
struct LimitArgs {
    /// project (session cwd, active venv) or strict (staging dir, confined).
    #[arg(long, value_name = "project|strict")]
    mode: Option<String>,
    /// Wall-clock limit in seconds, 1e-9 to 86400 (default: code_execution.timeout, else 300).
    // Negative values reach the range check, whose message names the flag, instead of being
    // taken for an unknown option.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    timeout: Option<f64>,
    /// Tool-call budget (default: code_execution.max_tool_calls, else 50).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    max_tool_calls: Option<usize>,
    /// Bytes of the script's stdout kept, its first 40% and last 60% (default:
    /// code_execution.stdout_limit, else 51200).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    stdout_limit: Option<u64>,
    /// Bytes of the script's stderr kept (default: code_execution.stderr_limit, else 10240).
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    stderr_limit: Option<u64>,
    /// Session working directory (default: $TERMINAL_CWD, else the current directory).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Where scripts, terminal and the file tools run: local, docker (or podman), ssh,
    /// singularity (or apptainer), modal, daytona (default: terminal.backend, else local).
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
}

impl LimitArgs {
    /// Applies the flags over the config's settings, refusing impossible values.
    fn apply(&self, config: &mut Config) -> Result<(), UsageError> {
        let requested = Requested {
            mode: self.mode.as_deref(),
            timeout: self.timeout,
            max_tool_calls: self.max_tool_calls.map(|n| n as u64),
            stdout_limit: self.stdout_limit,
            stderr_limit: self.stderr_limit,
        };
        Overrides::check(requested, Spelling::Flag)
            .map_err(|e| UsageError(e.to_string()))?
            .apply_to_config(config);
        Ok(())
    }

    /// The session working dir the flags name (or the default), checked.
    fn session_cwd(&self) -> Result<PathBuf, UsageError> {
        vibeos_supervisor::session_cwd(self.cwd.as_deref()).map_err(|e| UsageError(e.to_string()))
    }
}

/// With a backend that does not mount this host's dir, `--cwd` names the working dir over
/// there (SPEC §9: the backend is where the script, `terminal` and the file tools run), so it
/// overrides `terminal.cwd` and is not looked for on this host. It must be absolute: there is
/// no cwd over there to resolve it against before the backend starts.
fn backend_side_cwd(
    backend: &mut BackendSettings,
    limits: &mut LimitArgs,
) -> Result<(), UsageError> {
    if !backend.cwd_is_remote() {
        return Ok(());
    }
    let Some(dir) = limits.cwd.take() else {
        return Ok(());
    };
    let name = backend.backend.as_str();
    let text = dir.to_str().ok_or_else(|| {
        UsageError(format!(
            "--cwd {}: not valid UTF-8; the {name} backend takes its working dir by name",
            dir.display()
        ))
    })?;
    if !text.starts_with('/') {
        return Err(UsageError(format!(
            "--cwd {text}: with the {name} backend --cwd names a directory inside the backend \
             and must be absolute (like terminal.cwd)"
        )));
    }
    backend.cwd = Some(text.to_string());
    Ok(())
}

#[derive(Subcommand, Debug)]
enum EnvCommand {
    /// Show every variable of this environment, kept or dropped, and the rule that decided it.
    Audit {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Audit for a script run by this backend, as `run --backend` would (default:
        /// terminal.backend, else local): a remote one gets no host-specific variable.
        #[arg(long, value_name = "NAME")]
        backend: Option<String>,
    },
}

/// A failure before any script ran: usage or configuration (exit 2).
struct UsageError(String);

/// The C entry point: `process_start` does what std's start-up would have, then the command
/// runs and the process exits with its code.
// SAFETY: `#![no_main]` leaves the C `main` symbol to this crate: std emits no `main` of its
// own then, and no other object linked into the binary defines one. The C runtime calls it
// once, on the main thread, with the usual `argc`/`argv`.
#[unsafe(no_mangle)]
extern "C" fn main(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    // SAFETY: these are the C runtime's own `argc` and `argv`.
    unsafe { process_start::prepare(argc, argv) };
    early_signals::handle_from_start();
    // A panic is reported by std's hook and ends the process with 101, as it would from a
    // Rust `main`; it must not unwind into the C caller.
    let code = std::panic::catch_unwind(command_main).unwrap_or(101);
    // std's exit flushes stdout first, as the return from a Rust `main` did.
    std::process::exit(i32::from(code))
}

/// Runs the command line and returns the process's exit code.
fn command_main() -> u8 {
    let cli = match Cli::try_parse_from(process_start::args_os()) {
        Ok(cli) => {
            if !matches!(cli.command, Command::Run(_)) {
                early_signals::hand_back();
            }
            cli
        }
        Err(e) => {
            if !e.use_stderr() {
                // --help, --version: not errors, but their text must reach stdout.
                return output_written(e.print(), 0);
            }
            // A caller that asked for JSON parses stdout: it gets the result object even when
            // the command line itself is wrong, and the human message stays on stderr.
            let _ = e.print();
            if json_requested() {
                // clap's first paragraph is the error itself (tips and usage follow).
                let rendered = e.render().to_string();
                let first: Vec<&str> = rendered
                    .lines()
                    .take_while(|l| !l.trim().is_empty())
                    .map(str::trim)
                    .collect();
                let message = first.join(" ");
                let message = message.strip_prefix("error: ").unwrap_or(&message);
                print_usage_error_json(format!("{message} (see vibeos-exec --help)"));
            }
            return 2;
        }
    };
    let json_output = matches!(&cli.command, Command::Run(r) if r.json);
    let outcome = real_main(cli);
    // An interpreter `run` prestarted for a request that never reached execute (a later usage
    // error) is stopped here rather than by its reaper once we are gone.
    vibeos_supervisor::prestart::discard();
    // Reapers report their script's status before they exit: the output is out already, and
    // this waits for the last one's exit so none is left as a zombie for our parent's side.
    vibeos_supervisor::wait_for_reapers();
    match outcome {
        Ok(code) => code,
        Err(UsageError(message)) => {
            if json_output {
                print_usage_error_json(message);
            } else {
                eprintln!("vibeos-exec: {message}");
            }
            2
        }
    }
}

/// Whether the raw command line asks for `--json` (before any `--`).
fn json_requested() -> bool {
    process_start::args_os()
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| *a == "--json")
}

/// Prints a usage or configuration error as the result object `run --json` prints for an
/// execution that could not start (status `error`, `exit_code` null), so JSON callers always get
/// the same shape.
fn print_usage_error_json(message: String) {
    let args: Vec<String> = process_start::args_os()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // The mode a usable `--mode` asked for (the last one, as clap takes it); none otherwise:
    // `--mode bogus`, or a mode the configuration would have set, which an error before it
    // was read does not know (a usage error said `"mode": "project"` for both).
    let mut mode = "";
    let before_separator = args.iter().take_while(|a| *a != "--").count();
    for (i, arg) in args[..before_separator].iter().enumerate() {
        let value = match arg.strip_prefix("--mode=") {
            Some(v) => Some(v),
            None if arg == "--mode" => args.get(i + 1).map(String::as_str),
            None => None,
        };
        if let Some(v) = value {
            mode = match v {
                "strict" => "strict",
                "project" => "project",
                _ => "",
            };
        }
    }
    let json = vibeos_supervisor::ExecutionResult::failed_to_start(mode, message, 0.0).to_json();
    // The exit code is the usage error's (2) whether or not the object could be written; a
    // failed write is still said on stderr.
    let _ = output_written(write_stdout(format!("{json}\n").as_bytes()), 2);
}

/// Writes `bytes` to stdout and flushes it, so that a failure (a full disk, a closed pipe)
/// is seen here rather than lost in the flush std does at exit, which ignores errors.
fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

/// The exit code of a command whose output was written with `written`: `code` when the write
/// succeeded; 0, quietly, when the reader closed the pipe (EPIPE: SIGPIPE is ignored, so this
/// is an error instead of a signal; like ripgrep, a reader that stopped reading, as `| head`
/// does, is not a failure); else 1, with the error on stderr.
fn output_written(written: std::io::Result<()>, code: u8) -> u8 {
    match written {
        Ok(()) => code,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            // `eprintln!` would panic if stderr failed too; there is nowhere left to say it.
            let why = if process_start::stdout_closed_at_start() {
                "stdout was closed when vibeos-exec started".to_string()
            } else {
                io_error_text(&e)
            };
            let _ = writeln!(
                std::io::stderr(),
                "vibeos-exec: cannot write the output: {why}"
            );
            1
        }
    }
}

/// An I/O error as a sentence: the OS's text without std's " (os error N)" suffix.
fn io_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(cut) if e.raw_os_error().is_some() => text[..cut].to_string(),
        _ => text,
    }
}

/// Refuses an empty name in a toolset list flag (`--enable-toolsets ''`, `--toolsets a,,b`):
/// it names no toolset, and the registry would refuse it without naming the flag.
fn check_toolset_flags(command: &Command) -> Result<(), UsageError> {
    const ENABLE: (&str, &str) = ("--enable-toolsets", "to select every toolset");
    const DISABLE: (&str, &str) = ("--disable-toolsets", "to disable none");
    let lists: Vec<((&str, &str), &[String])> = match command {
        Command::Tools {
            command: ToolsCommand::List(ListArgs { selection: a, .. }) | ToolsCommand::Schema(a),
        } => vec![
            (ENABLE, &a.enable_toolsets[..]),
            (DISABLE, &a.disable_toolsets[..]),
        ],
        Command::Serve(a) => vec![(
            ("--toolsets", "to offer execute_code alone"),
            &a.toolsets[..],
        )],
        _ => Vec::new(),
    };
    for ((flag, without), names) in lists {
        if names.iter().any(|n| n.trim().is_empty()) {
            return Err(UsageError(format!(
                "{flag} {:?} holds an empty toolset name; give comma-separated toolset names \
                 (e.g. {flag} web,file), or leave the flag out {without}",
                names.join(",")
            )));
        }
    }
    Ok(())
}

fn real_main(mut cli: Cli) -> Result<u8, UsageError> {
    check_toolset_flags(&cli.command)?;
    if let Some(level) = &cli.log_level {
        logging::validate_level(level).map_err(|e| UsageError(e.to_string()))?;
    }
    // doctor diagnoses: a broken config file is one of its findings (reported, exit 2), not a
    // reason to say nothing about the machine.
    let mut config_error = None;
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) if matches!(cli.command, Command::Doctor { .. }) => {
            config_error = Some(e.to_string());
            Config::default()
        }
        Err(e) => return Err(UsageError(e.to_string())),
    };
    let backend_flag = match &cli.command {
        Command::Run(a) => a.limits.backend.clone(),
        Command::Serve(a) => a.limits.backend.clone(),
        Command::Env {
            command: EnvCommand::Audit { backend, .. },
        } => backend.clone(),
        _ => None,
    };
    // Likewise a backend that lacks a key (`backend: modal` without MODAL_TOKEN_ID) is one of
    // doctor's findings: the rest is reported with the other settings as read.
    let mut backend_error = None;
    let mut backend = match backends::settings(&config, backend_flag.as_deref()) {
        Ok(settings) => settings,
        Err(e) if matches!(cli.command, Command::Doctor { .. }) => {
            backend_error = Some(e);
            backends::settings(&config, Some("local")).map_err(UsageError)?
        }
        // `env audit` needs the backend's name only; a setting it lacks does not change what
        // a script there would get.
        Err(_) if matches!(cli.command, Command::Env { .. }) => {
            let mut settings = backends::settings(&config, Some("local")).map_err(UsageError)?;
            settings.backend =
                backends::selected_kind(&config, backend_flag.as_deref()).map_err(UsageError)?;
            settings
        }
        Err(e) => return Err(UsageError(e)),
    };
    if let Command::Run(RunArgs { limits, .. }) | Command::Serve(ServeArgs { limits, .. }) =
        &mut cli.command
    {
        backend_side_cwd(&mut backend, limits)?;
    }
    // `run` knows its request now: a local one starts its interpreter at once, and the rest of
    // this process's start (logging, the tool registry, the stub) overlaps the interpreter's.
    let prepared = match &cli.command {
        Command::Run(args) => {
            let request = prepare_run(args, &config);
            // A caller that gave up while the script was being read gets the result object
            // of an execution that never started, not a usage error.
            if let Some(sig) = early_signals::received() {
                return Ok(report_stopped_before_start(sig, args, &config));
            }
            let request = request?;
            if request.mode == vibeos_supervisor::Mode::Strict
                && backend.backend != vibeos_tools::environments::BackendKind::Local
            {
                // Known from the configuration alone: a usage error (exit 2), said before a
                // container is made or a host is reached.
                return Err(UsageError(
                    vibeos_supervisor::RemoteError::StrictRemote(backend.backend.as_str())
                        .to_string(),
                ));
            }
            if backend.backend == vibeos_tools::environments::BackendKind::Local {
                // An unusable code_execution.python is a configuration error (exit 2, SPEC
                // §10), said before anything starts, like every other bad setting.
                request
                    .check_configured_python()
                    .map_err(|e| UsageError(configured_python_error(&config, &e)))?;
                vibeos_supervisor::prestart::prestart(&request);
            }
            Some(request)
        }
        _ => None,
    };
    // The tools read their own sections (command_allowlist, web) from the same file.
    if let Some(path) = &cli.config {
        vibeos_tools::settings::set_config_path(Some(path.clone()));
    }
    let level = cli
        .log_level
        .clone()
        .or_else(|| config.log_level.clone())
        .unwrap_or_else(|| "warn".into());
    // Held to the end of main: dropping it flushes the log file.
    let _log_guard = logging::init(&level).map_err(|e| UsageError(e.to_string()))?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if let Err(e) = execute_code_tool::register_execute_code(vibeos_tools::registry(), &config) {
        tracing::error!("{e}");
    }
    match cli.command {
        Command::BackendAgent {
            no_shell_session,
            listen,
        } => {
            vibeos_tools::environments::session::set_enabled(!no_shell_session);
            vibeos_tools::environments::agent::approve_all();
            vibeos_tools::environments::agent::contain_commands();
            let stdin = std::io::stdin();
            let served = vibeos_tools::environments::agent::serve(
                vibeos_tools::registry(),
                stdin.lock(),
                std::io::stdout(),
                listen.as_deref(),
            );
            vibeos_tools::environments::session::clear_all();
            served
                .map(|()| 0)
                .map_err(|e| UsageError(format!("backend-agent: {e}")))
        }
        Command::Backends {
            command: BackendsCommand::Gc { all, json },
        } => Ok(backends::gc(&backend, all, json).unwrap_or_else(|e| {
            // The engine failing is a runtime error (exit 1, as for `run`), not a usage one.
            eprintln!("vibeos-exec: {e}");
            1
        })),
        Command::Tools { command } => {
            let extensions = vibeos_supervisor::extensions::load(&config, vibeos_tools::registry());
            let code = tools(command, &config, &extensions);
            extensions.shutdown();
            code
        }
        Command::Run(args) => {
            let extensions = extensions_for(&config, &args.limits);
            backends::activate(backend, args.limits.cwd.as_deref());
            let code = match prepared {
                Some(request) => run(request, args.json),
                None => Err(UsageError("the run request was not prepared".into())),
            };
            backends::shutdown();
            extensions.shutdown();
            code
        }
        Command::Doctor { json } => {
            let report = vibeos_supervisor::doctor::probe()
                .with_config(&config)
                .with_backend(backend.backend.as_str());
            let backends = backends::report(&backend);
            let text = if json {
                let mut v = report.to_json();
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("backends".into(), backends::report_json(&backends));
                    obj.insert("config_error".into(), config_error.clone().into());
                    obj.insert("backend_error".into(), backend_error.clone().into());
                }
                format!("{v}\n")
            } else {
                let config_line = match &config_error {
                    Some(e) => format!(
                        "\nconfig: ERROR: {e}\n  (the report above assumes the defaults; \
                         fix the file, then run doctor again)\n"
                    ),
                    None => String::new(),
                };
                let backend_line = match &backend_error {
                    Some(e) => format!(
                        "\nbackend: ERROR: {e}\n  (the selected backend cannot start; the \
                         report above shows the others)\n"
                    ),
                    None => String::new(),
                };
                format!(
                    "{}{}{config_line}{backend_line}",
                    report.render_text(),
                    backends::report_text(&backends)
                )
            };
            // A broken config file or backend choice is still a config error (exit 2, SPEC §10).
            let code = if config_error.is_some() || backend_error.is_some() {
                2
            } else {
                0
            };
            Ok(output_written(write_stdout(text.as_bytes()), code))
        }
        Command::Serve(args) => {
            // After the built-ins, the tools of MCP servers and plugins (SPEC §7), as for `run`
            // and `tools`: scripts get the script-callable ones, `--toolsets mcp-<name>` offers
            // a server's tools directly. A server that fails is logged and skipped.
            let extensions = extensions_for(&config, &args.limits);
            backends::activate(backend, args.limits.cwd.as_deref());
            let code = serve(args, config, &extensions);
            backends::shutdown();
            extensions.shutdown();
            code
        }
        Command::Env {
            command: EnvCommand::Audit { json, .. },
        } => {
            let audit = audit::audit_for(&config.env_passthrough, Some(backend.backend.as_str()))
                .map_err(|e| UsageError(e.to_string()))?;
            let text = if json {
                format!("{}\n", audit.to_json())
            } else {
                audit.render_table()
            };
            Ok(output_written(write_stdout(text.as_bytes()), 0))
        }
    }
}

/// `tools list` and `tools schema`: both built from the registry exactly as the model's tool
/// list is, so what they show is what the model gets.
fn tools(
    command: ToolsCommand,
    config: &Config,
    extensions: &vibeos_tools::mcp_client::McpManager,
) -> Result<u8, UsageError> {
    // Written to stdout in one go at the end, where a failed write is reported.
    use std::fmt::Write as _;
    let reg = vibeos_tools::registry();
    // A lazy server's (or the plugin host's) toolset named here has no tools until the server
    // runs: start it, or the name would be unknown to `tools list`.
    let (ToolsCommand::Schema(args)
    | ToolsCommand::List(ListArgs {
        selection: args, ..
    })) = &command;
    extensions
        .start_for_toolsets(&[&args.enable_toolsets[..], &args.disable_toolsets[..]].concat());
    let mut out = String::new();
    match command {
        ToolsCommand::Schema(args) => {
            let settings = execute_code_tool::execute_code_settings(config, None);
            let defs = reg
                .get_tool_definitions_with(&args.enable_toolsets, &args.disable_toolsets, &settings)
                .map_err(|e| UsageError(e.to_string()))?;
            let text = serde_json::to_string_pretty(&defs)
                .map_err(|e| UsageError(format!("cannot render the schemas: {e}")))?;
            let _ = writeln!(out, "{text}");
        }
        ToolsCommand::List(ListArgs {
            selection: args,
            json,
        }) => {
            let rows = reg
                .tool_report(&args.enable_toolsets, &args.disable_toolsets)
                .map_err(|e| UsageError(e.to_string()))?;
            let status = |a: &vibeos_tools::Availability| match a {
                vibeos_tools::Availability::Available => "available".to_string(),
                vibeos_tools::Availability::Unavailable(why) => format!("unavailable: {why}"),
            };
            if json {
                let mut list: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "kind": "tool",
                            "name": r.name,
                            "toolset": r.toolset,
                            "available": r.availability.is_available(),
                            "status": status(&r.availability),
                            "requires_env": r.requires_env,
                            "emoji": r.emoji,
                            "is_async": r.is_async,
                            "source": r.source.to_string(),
                            "server_status": server_status(extensions, &r.source),
                        })
                    })
                    .collect();
                // The servers and plugins follow the tools, in the same array so consumers of
                // the tool rows keep working (docs/mcp-and-plugins.md, "tools list --json").
                list.extend(extensions.report().iter().map(server_row));
                let _ = writeln!(out, "{}", serde_json::Value::Array(list));
            } else {
                let table: Vec<[String; 4]> = rows
                    .iter()
                    .map(|r| {
                        let mut st = status(&r.availability);
                        // Only when the tool is available through its env vars: one that a
                        // config file enabled (the web tools' `web:` section) requires none.
                        let via_env = !r.requires_env.is_empty()
                            && r.requires_env.iter().all(|k| std::env::var_os(k).is_some());
                        if r.availability.is_available() && via_env {
                            st.push_str(&format!(" (requires env: {})", r.requires_env.join(", ")));
                        }
                        [r.name.clone(), r.toolset.clone(), st, r.emoji.clone()]
                    })
                    .collect();
                let header = [
                    "NAME".to_string(),
                    "TOOLSET".to_string(),
                    "STATUS".to_string(),
                    "EMOJI".to_string(),
                ];
                let width = |i: usize| {
                    table
                        .iter()
                        .chain(std::iter::once(&header))
                        .map(|r| r[i].chars().count())
                        .max()
                        .unwrap_or(0)
                };
                let (w0, w1, w2) = (width(0), width(1), width(2));
                for row in std::iter::once(&header).chain(table.iter()) {
                    let line =
                        format!("{:w0$}  {:w1$}  {:w2$}  {}", row[0], row[1], row[2], row[3]);
                    let _ = writeln!(out, "{}", line.trim_end());
                }
                let available = rows
                    .iter()
                    .filter(|r| r.availability.is_available())
                    .count();
                let _ = writeln!(out, "\n{} tools, {available} available", rows.len());
                let servers = extensions.report();
                if !servers.is_empty() {
                    let _ = writeln!(out, "\nMCP SERVERS AND PLUGINS");
                    for s in &servers {
                        let toolsets = if s.toolsets.is_empty() {
                            String::new()
                        } else {
                            format!("  [{}]", s.toolsets.join(", "))
                        };
                        let _ = writeln!(
                            out,
                            "{}  {} ({}, {})  {}{toolsets}",
                            s.name, s.kind, s.transport, s.startup, s.state
                        );
                    }
                }
            }
        }
    }
    Ok(output_written(write_stdout(out.as_bytes()), 0))
}

/// One MCP server, plugin host or failed plugin as a row of `tools list --json`. Its `kind`
/// tells it from a tool row (`tool`), and it has no `name` key, so a consumer looking tools up
/// by name never takes it for one.
fn server_row(s: &vibeos_tools::mcp_client::ServerReport) -> serde_json::Value {
    use vibeos_tools::mcp_client::ServerState;
    let (state, tools, error) = match &s.state {
        ServerState::NotStarted => ("lazy", None, None),
        ServerState::Running(n) => ("running", Some(*n), None),
        ServerState::Failed(why) => ("failed", None, Some(why.as_str())),
        ServerState::Stopped => ("stopped", None, None),
    };
    let mut row = serde_json::json!({
        "kind": match s.kind {
            "mcp" => "mcp_server",
            "plugins" => "plugin_host",
            other => other,
        },
        "server": s.name,
        "transport": s.transport,
        "startup": s.startup,
        "state": state,
        "status": s.state.to_string(),
        "tools": tools,
        "toolsets": s.toolsets,
        "error": error,
    });
    if s.kind == "plugin" {
        // A plugin the plugin host could not load: named by its module, hosted by `plugins`.
        row["plugin"] = s.name.trim_start_matches("plugin ").into();
        row["server"] = vibeos_supervisor::extensions::PLUGIN_HOST.into();
    }
    row
}

/// The state of the MCP server or plugin host behind a tool, for `tools list --json`
/// (`null` for built-ins and host tools).
fn server_status(
    extensions: &vibeos_tools::mcp_client::McpManager,
    source: &vibeos_tools::ToolSource,
) -> serde_json::Value {
    let server = match source {
        vibeos_tools::ToolSource::Mcp(name) => name.as_str(),
        vibeos_tools::ToolSource::Plugin(_) => vibeos_supervisor::extensions::PLUGIN_HOST,
        vibeos_tools::ToolSource::Builtin | vibeos_tools::ToolSource::Host(_) => {
            return serde_json::Value::Null
        }
    };
    extensions
        .servers()
        .iter()
        .find(|s| s.name() == server)
        .map(|s| serde_json::Value::String(s.state().to_string()))
        .unwrap_or(serde_json::Value::Null)
}

/// The message of an unusable `code_execution.python`, naming the config file it came from as
/// the config's other value errors do.
fn configured_python_error(config: &Config, e: &vibeos_supervisor::InterpreterError) -> String {
    match &config.source {
        Some(file) => format!("config file {}: {e}", file.display()),
        None => e.to_string(),
    }
}

/// Largest script `run` reads. A script an agent or a CI job writes is a few KB; the cap is
/// there because a file or stdin may never end (`run /dev/zero`, `yes | vibeos-exec run -`),
/// and reading one whole would take the machine's memory before anything could be said.
const MAX_SCRIPT_BYTES: u64 = 16 << 20;

fn read_script(file: &str) -> Result<String, UsageError> {
    // One byte past the cap tells "at the cap" from "over it" without trusting a size that a
    // pipe does not have.
    let bytes = if file == "-" {
        early_signals::read_script(std::io::stdin(), MAX_SCRIPT_BYTES + 1)
            .map_err(|e| UsageError(format!("cannot read the script from stdin: {e}")))?
    } else {
        std::fs::File::open(file)
            .and_then(|f| early_signals::read_script(f, MAX_SCRIPT_BYTES + 1))
            .map_err(|e| UsageError(format!("cannot read script {file}: {e}")))?
    };
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return Err(UsageError(format!(
            "script {} is larger than {} MiB; pass the script itself (a few KB), not its data: \
             a script can read its data with the file tools",
            if file == "-" { "from stdin" } else { file },
            MAX_SCRIPT_BYTES >> 20
        )));
    }
    let name = if file == "-" { "stdin" } else { file };
    String::from_utf8(bytes).map_err(|e| {
        UsageError(format!(
            "script {name} is not valid UTF-8 (invalid byte at offset {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The request `run` executes: the script read and the flags applied to the config.
fn prepare_run(args: &RunArgs, config: &Config) -> Result<ExecutionRequest, UsageError> {
    let code = read_script(&args.file)?;
    if code.trim().is_empty() {
        return Err(UsageError(format!(
            "script {} is empty; pass Python code that prints its result",
            if args.file == "-" {
                "from stdin"
            } else {
                &args.file
            }
        )));
    }
    let mut config = config.clone();
    args.limits.apply(&mut config)?;
    let mut request = ExecutionRequest::from_config(code, &config);
    if args.limits.cwd.is_some() {
        request.cwd = Some(args.limits.session_cwd()?);
    }
    Ok(request)
}

/// The configured MCP servers and plugins of a `run` or `serve` session: the project plugins
/// are those of its `--cwd`, and none in strict mode (`--mode` included). Flags that do not
/// apply are reported later, where the session refuses them; until then, strict's rule holds.
fn extensions_for(
    config: &Config,
    limits: &LimitArgs,
) -> std::sync::Arc<vibeos_tools::mcp_client::McpManager> {
    let mut effective = config.clone();
    if limits.apply(&mut effective).is_err() {
        effective.mode = vibeos_supervisor::Mode::Strict;
    }
    vibeos_supervisor::extensions::load_in(
        &effective,
        vibeos_tools::registry(),
        limits.cwd.as_deref(),
    )
}

/// What `run` reports when a signal stopped it before an execution started: status
/// `interrupted`, exit code 130, nothing ran.
fn report_stopped_before_start(
    sig: nix::sys::signal::Signal,
    args: &RunArgs,
    config: &Config,
) -> u8 {
    let mut config = config.clone();
    let mode = match args.limits.apply(&mut config) {
        Ok(()) => config.mode.as_str(),
        Err(_) => Config::default().mode.as_str(),
    };
    let message = format!("stopped by {sig} before the script started; nothing ran");
    let result = vibeos_supervisor::ExecutionResult::interrupted_before_start(mode, message);
    let written = if args.json {
        write_stdout(format!("{}\n", result.to_json()).as_bytes())
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "vibeos-exec: {}",
            result.error.as_deref().unwrap_or_default()
        );
        write_stdout(format!("{}\n", result.output).as_bytes())
    };
    output_written(written, result.status.exit_code() as u8)
}

fn run(request: ExecutionRequest, json: bool) -> Result<u8, UsageError> {
    // One thread serves the whole execution: RPC replies then never wait for a wake-up on
    // another core. Tools that may block run on the blocking pool, bounded ones inline.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async {
        let interrupt = Interrupt::new();
        watch_signals(interrupt.clone());
        // A signal that came after the script was read and before the watch above stops the
        // execution the same way (its prestarted interpreter is cleaned up).
        if early_signals::received().is_some() {
            interrupt.interrupt();
        }
        execute(request, vibeos_tools::registry(), interrupt).await
    });
    let written = if json {
        write_stdout(format!("{}\n", result.to_json()).as_bytes())
    } else {
        if result.output.is_empty() {
            if let Some(e) = &result.error {
                eprintln!("vibeos-exec: {e}");
            }
        }
        let mut out = std::io::stdout().lock();
        out.write_all(result.output.as_bytes())
            .and_then(|()| {
                if !result.output.is_empty() && !result.output.ends_with('\n') {
                    out.write_all(b"\n")
                } else {
                    Ok(())
                }
            })
            .and_then(|()| out.flush())
    };
    // A tool call still on the blocking pool (a sync tool that cannot be cancelled) must not
    // hold the process once the result is out: dropping the runtime would wait for it
    // unboundedly. Async calls (MCP) ended with the execution already (`cancel_scope`).
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // The script's status decides the code only when its output was delivered.
    Ok(output_written(written, result.status.exit_code() as u8))
}

/// `serve`: the run limits applied to the config (so the execute_code description states
/// them), then the MCP server until the client leaves or a signal stops it.
fn serve(
    args: ServeArgs,
    mut config: Config,
    extensions: &vibeos_tools::mcp_client::McpManager,
) -> Result<u8, UsageError> {
    use vibeos_mcp_server as mcp;
    args.limits.apply(&mut config)?;
    // A lazy server's toolset named by --toolsets needs its server running to resolve. One
    // that failed is logged and left out: the server still serves execute_code and the rest.
    extensions.start_for_toolsets(&args.toolsets);
    let mut toolsets = args.toolsets;
    toolsets.retain(|name| match extensions.failed_toolset(name) {
        Some(why) => {
            tracing::warn!("--toolsets: `{name}` skipped: {why}");
            false
        }
        None => true,
    });
    let cwd = args.limits.session_cwd()?;
    let addr = args
        .http
        .as_deref()
        .map(mcp::parse_http_addr)
        .transpose()
        .map_err(|e| UsageError(e.to_string()))?;
    let registry = vibeos_tools::registry();
    if let Err(e) = execute_code_tool::register_execute_code(registry, &config) {
        tracing::error!("{e}");
    }
    // A long-lived server runs many scripts: keep warm interpreters (code_execution.pool_size).
    vibeos_supervisor::pool::enable(config.pool_size);
    // Warm calls fork from one pre-initialised interpreter per key (docs/warm-pool.md).
    vibeos_supervisor::zygote::set_enabled(config.pool_size > 0);
    let settings = mcp::ServeSettings {
        config,
        cwd,
        toolsets,
        max_concurrent: args.max_concurrent,
        max_request_bytes: args.max_request_bytes,
        max_sessions: args.max_sessions,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // One client over stdio: one worker runs its reader, rmcp's dispatch, the call and the
    // reply, so none of them waits for another worker's wake-up (paced calls 0.04-0.12 ms
    // faster in A/B rounds, 16 concurrent callers as fast; docs/warm-pool.md). Blocking work
    // keeps its own pool. HTTP serves many clients and keeps a worker per CPU; the variable
    // tokio reads (TOKIO_WORKER_THREADS) still decides when it is set.
    if addr.is_none() && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(1);
    }
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(async {
        let stop = tokio_util::sync::CancellationToken::new();
        stop_on_signals(stop.clone());
        match addr {
            None => mcp::serve_stdio(registry, settings, stop).await,
            Some(addr) => {
                mcp::serve_http(registry, settings, addr, stop, |bound| {
                    eprintln!(
                        "vibeos-exec: serving MCP over streamable HTTP at http://{bound}/mcp"
                    );
                })
                .await
            }
        }
    });
    // Executions still cleaning up in blocking threads must not hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match served {
        Ok(()) => Ok(0),
        // The session failed (the client left before initializing, the transport broke): a
        // runtime error, like a failed `run`, not a usage one.
        Err(e @ mcp::ServeError::Io(_)) => {
            eprintln!("vibeos-exec: {e}");
            Ok(1)
        }
        Err(e) => Err(UsageError(e.to_string())),
    }
}

/// SIGINT, SIGTERM and SIGHUP stop the MCP server: every running execution is interrupted and
/// cleaned up before the process exits.
fn stop_on_signals(stop: tokio_util::sync::CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        let stop = stop.clone();
        match signal(kind) {
            Ok(mut stream) => {
                tokio::spawn(async move {
                    if stream.recv().await.is_some() {
                        stop.cancel();
                    }
                });
            }
            Err(e) => tracing::warn!("cannot watch signal {kind:?}: {e}"),
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP stop the running script (status `interrupted`) so that cleanup
/// runs: no staging dir, socket or process is left behind when the CLI itself is stopped.
fn watch_signals(interrupt: Interrupt) {
    use tokio::signal::unix::{signal, SignalKind};
    for (kind, sig) in [
        (SignalKind::interrupt(), nix::sys::signal::Signal::SIGINT),
        (SignalKind::terminate(), nix::sys::signal::Signal::SIGTERM),
        (SignalKind::hangup(), nix::sys::signal::Signal::SIGHUP),
    ] {
        if !early_signals::stops_run(sig) {
            // `nohup`: tokio's handler would replace the ignored disposition.
            continue;
        }
        let interrupt = interrupt.clone();
        match signal(kind) {
            Ok(mut stream) => {
                tokio::spawn(async move {
                    if stream.recv().await.is_some() {
                        interrupt.interrupt();
                    }
                });
            }
            Err(e) => tracing::warn!("cannot watch signal {kind:?}: {e}"),
        }
    }
}
