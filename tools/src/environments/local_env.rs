//! `local` as an [`Environment`]: this machine, with no agent (tools run in this process).
//!
//! execute_code keeps its own local launcher (cold and warm, with the reaper and strict
//! confinement, supervisor/src/execute.rs); this implementation serves callers that only need
//! the backend operations — a command in its own process group, a socket dir — so code
//! written against the trait also runs locally.

use super::settings::BackendSettings;
use super::{Channel, ClientProcess, Connections, EnvError, Environment, ExecSpec, Site, Spawned};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// This machine.
pub struct LocalEnv {
    site: Site,
}

impl LocalEnv {
    /// The local environment for `settings`.
    pub fn new(settings: &BackendSettings) -> Self {
        let workdir = settings.cwd.clone().unwrap_or_else(|| {
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "/".into())
        });
        LocalEnv {
            site: Site {
                workdir,
                python: settings.python.clone(),
            },
        }
    }
}

impl Environment for LocalEnv {
    fn backend(&self) -> &'static str {
        "local"
    }

    fn isolated(&self) -> bool {
        false
    }

    fn site(&self) -> &Site {
        &self.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check("local")?;
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(spec.argv.iter().skip(1))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(spec.cwd.as_deref().unwrap_or(&self.site.workdir))
            .process_group(0);
        ClientProcess::spawn("local", cmd, None)
    }

    fn open_channel(&self, exec_id: &str, _token: &str) -> Result<Channel, EnvError> {
        let err = |e: std::io::Error| EnvError::Command {
            backend: "local",
            what: "creating the socket dir".into(),
            message: e.to_string(),
        };
        let dir = tempfile::Builder::new()
            .prefix("vibeos-exec-")
            .tempdir()
            .map_err(err)?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .map_err(err)?;
        let remote_dir = std::env::temp_dir()
            .join(format!("vibeos-exec-{exec_id}"))
            .display()
            .to_string();
        Ok(Channel {
            connections: Connections::Bind(dir.path().join("rpc.sock")),
            remote_socket: dir.path().join("rpc.sock").display().to_string(),
            remote_dir,
            hello: false,
            guard: Box::new(dir),
        })
    }

    fn agent(&self) -> Option<&super::agent::AgentClient> {
        None
    }

    fn stop(&self) {}
}
