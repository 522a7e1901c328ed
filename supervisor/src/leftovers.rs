//! `vibeos-exec backends gc`: finds and removes what a crashed host left in every backend that
//! keeps things beyond the host's life — docker/podman containers, Modal sandboxes, Daytona
//! sandboxes — by the labels those backends set (`vibeos-exec=1`, the owner, the machine) —
//! and ssh ControlMasters whose owner is gone (by the owner file in their control dir), and
//! the socket dirs the relay and the Modal sidecar keep on this host (by the same owner file).
//!
//! Why it sweeps each backend apart: a user with only Modal configured has no docker engine,
//! and one backend that cannot be reached must not hide what the others removed. Docker is
//! swept when it is selected, has an image configured, or no cloud backend is configured (the
//! command's original scope); Modal when it is selected or `terminal.modal_image` is set;
//! Daytona when it is selected or `DAYTONA_API_KEY` is set (as doctor counts them configured);
//! ssh when it is selected or `terminal.ssh_host` is set.

use serde_json::{json, Map, Value};
use vibeos_tools::environments::docker::GcReport;
use vibeos_tools::environments::{self, BackendKind, BackendSettings, EnvError};

/// One backend's sweep.
struct Sweep {
    backend: &'static str,
    result: Result<GcReport, EnvError>,
}

/// The backends to sweep for `settings` (see the module doc).
fn swept(settings: &BackendSettings) -> Vec<&'static str> {
    let modal = settings.backend == BackendKind::Modal || settings.modal_image.is_some();
    let daytona = settings.backend == BackendKind::Daytona
        || std::env::var_os("DAYTONA_API_KEY").is_some_and(|k| !k.is_empty());
    let ssh = settings.backend == BackendKind::Ssh || settings.ssh_host.is_some();
    let docker = settings.backend == BackendKind::Docker
        || settings.docker_image.is_some()
        || !(modal || daytona || ssh);
    [
        ("docker", docker),
        ("modal", modal),
        ("daytona", daytona),
        ("ssh", ssh),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// Sweeps, prints the report (text, or one JSON object with `--json`) and returns the exit
/// code: 0, or 1 when a backend could not be swept while another was. When none could be, the
/// error names each.
pub fn gc(settings: &BackendSettings, all: bool, json_out: bool) -> Result<u8, String> {
    let sweeps: Vec<Sweep> = swept(settings)
        .into_iter()
        .map(|backend| Sweep {
            backend,
            result: match backend {
                "modal" => environments::modal::gc(&settings.modal_python, all).map(|r| {
                    with_host_dirs(
                        r,
                        &[
                            environments::modal_sidecar::DIR_PREFIX,
                            &environments::relay::dir_prefix("modal"),
                        ],
                    )
                }),
                "daytona" => environments::daytona::gc(all)
                    .map(|r| with_host_dirs(r, &[&environments::relay::dir_prefix("daytona")])),
                "ssh" => environments::ssh::gc(),
                _ => environments::docker::gc(&settings.docker_binary, all),
            },
        })
        .collect();
    environments::modal_sidecar::Sidecar::shutdown();
    let failed: Vec<String> = sweeps
        .iter()
        .filter_map(|s| {
            s.result
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", s.backend))
        })
        .collect();
    if failed.len() == sweeps.len() {
        // A caller that asked for JSON parses stdout: it gets the report, each backend with
        // its error, and the exit code says it failed.
        if json_out {
            println!("{}", json_report(settings, &sweeps));
            for f in &failed {
                eprintln!("vibeos-exec: {f}");
            }
            return Ok(1);
        }
        return Err(failed.join("; "));
    }
    if json_out {
        println!("{}", json_report(settings, &sweeps));
    } else {
        print_text(settings, &sweeps);
    }
    Ok(u8::from(!failed.is_empty()))
}

/// `report` plus the socket dirs on this host that crashed hosts of the backend left
/// ([`environments::host_dirs`]), swept once the backend itself could be: a sweep that failed
/// touches nothing.
fn with_host_dirs(mut report: GcReport, prefixes: &[&str]) -> GcReport {
    for prefix in prefixes {
        report.removed.extend(environments::host_dirs::gc(prefix));
    }
    report
}

/// `removed` and `kept` of every backend together (docker's container names, the cloud
/// sandboxes' names or ids), docker's `engine` when docker was swept, and per backend its own
/// lists or its error.
fn json_report(settings: &BackendSettings, sweeps: &[Sweep]) -> Value {
    let (mut removed, mut kept) = (Vec::new(), Vec::new());
    let mut per = Map::new();
    for s in sweeps {
        let entry = match &s.result {
            Ok(r) => {
                removed.extend(r.removed.iter().cloned());
                kept.extend(r.kept.iter().cloned());
                json!({"removed": r.removed, "kept": r.kept})
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        per.insert(s.backend.into(), entry);
    }
    let mut report = json!({
        "removed": removed,
        "kept": kept,
        "backends": per,
    });
    // Docker's engine, only when docker was swept: an ssh-only sweep named an engine it never
    // asked.
    if sweeps.iter().any(|s| s.backend == "docker") {
        report["engine"] = Value::from(settings.docker_binary.as_str());
    }
    report
}

fn print_text(settings: &BackendSettings, sweeps: &[Sweep]) {
    for s in sweeps {
        let what = match s.backend {
            "docker" => "container",
            "ssh" => "connection",
            _ => "sandbox",
        };
        match &s.result {
            Err(e) => eprintln!("{}: cannot sweep: {e}", s.backend),
            Ok(r) => {
                // Docker's lines read as they always have; a cloud line names its backend.
                let tag = |name: &str| match s.backend {
                    "docker" => name.to_string(),
                    // A host path: a socket dir of this host, not a sandbox.
                    b if name.starts_with('/') && b != "ssh" => format!("{b} socket dir {name}"),
                    b => format!("{b} {what} {name}"),
                };
                for name in &r.removed {
                    println!("removed {}", tag(name));
                }
                // A cloud sandbox may also belong to another machine, which docker's cannot.
                let why = match s.backend {
                    "docker" => "its host is running, or persistent",
                    "ssh" => "its host is running",
                    _ => "its host is running, it belongs to another machine, or persistent",
                };
                for name in &r.kept {
                    println!(
                        "kept    {} ({why}; --all removes persistent ones)",
                        tag(name)
                    );
                }
                if r.removed.is_empty() && r.kept.is_empty() {
                    match s.backend {
                        "docker" => println!(
                            "no vibeos-exec containers found ({})",
                            settings.docker_binary
                        ),
                        "ssh" => println!("no vibeos-exec ssh connections found"),
                        b => println!("no vibeos-exec {b} sandboxes found"),
                    }
                }
            }
        }
    }
}
