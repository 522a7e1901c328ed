//! The fork server (zygote): one pre-initialised interpreter per launch key that forks a fresh
//! process per execution, so a warm call costs a `fork` instead of an interpreter start, and a
//! burst of calls is not limited by how fast a pool of single-use interpreters can refill.
//!
//! The server (`zygote_boot.py`) is started by the supervisor with the key's interpreter and
//! environment, imports what the stub imports (from the interpreter's own library only, so no
//! project module is ever loaded), reports ready and then only reads "fork a spare" requests
//! from a `SOCK_SEQPACKET` socketpair it inherited: nothing else can reach it, and it runs no
//! script code. A spare is one execution's processes forked ahead of its call: the reaper (own
//! session, child subreaper, signal handlers) and below it the script process, each waiting on
//! a channel whose other end the server hands to the supervisor with the reaper's pid and a
//! pidfd (`Spare`). Per execution the supervisor prepares everything exactly as for a cold
//! launch ([`crate::launch::open_channel`]): a fresh staging dir with the stub and the script,
//! the RPC channel and token, the scrubbed environment, the lifeline, and in strict mode the uid
//! lease, landlock ruleset, seccomp programs, rlimits and disk-budget tmpfs. It sends the
//! reaper its part (lifeline, status pipe, kill grace) and the script process the settings as
//! JSON with its descriptors as `SCM_RIGHTS`, directly; the server never sees a request. The
//! reaper relays termination with the kill grace and kills every descendant at the end; the
//! script process sets up its stdio, closes every other descriptor, applies the confinement in
//! `confine/child.rs`'s order, takes the environment, reseeds what a fork shares, and runs the
//! script as `__main__`. The reaper writes the script's wait status on a pipe, which is what
//! [`Forked::wait`] reads. When the execution is over, spares are asked for until two are
//! ahead and the next two staging dirs are prepared; a call then takes a spare forked while the
//! previous script ran, not one it has to wait for. Each prepared dir is paired with a spare
//! whose reaper already holds its part of the execution and, in strict mode, whose script
//! process applies that dir's confinement while it waits ([`arm`]), so the call sends one
//! message, carrying only what is its own.
//!
//! **Trust.** In strict mode as root the server keeps root and no confinement, because each
//! child needs a different uid and a landlock rule for its own staging dir; it drops both in
//! the child before any script byte is read. That is safe because the server never executes
//! anything but its bootstrap and the standard library, its only input is the socketpair whose
//! other end only this supervisor holds (a spare closes its copy before it forks the script
//! process), a waiting spare's only inputs are channels only this supervisor holds, and every
//! script runs in a process that has already dropped the privileges. See docs/warm-pool.md for
//! what a script can still observe of its siblings.

use crate::config::Mode;
use crate::confine::child::ChildConfinement;
use crate::error::StartError;
use crate::forked::poll_in;
pub use crate::forked::Forked;
use crate::launch::{open_channel, with_channel, Channel, LaunchKey, LaunchSpec, Launched};
use crate::launch::{Proc, Staging};
use crate::reaper::lifeline;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The server's program, run with `-c`.
const BOOT: &str = concat!(
    include_str!("script_runner.py"),
    include_str!("zygote_boot.py")
);

/// How long a server may take to start and import before it counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a fork request may take before the server counts as hung.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a call waits for its key's server to finish starting before it starts another way:
/// a normal start (an interpreter start and the stub's imports) takes well under this even on a
/// loaded machine, so only a slow or hung start sends calls elsewhere.
const STARTING_WAIT: Duration = Duration::from_secs(5);

/// Spares kept forked ahead per server. With one, a call that came right after the previous
/// one ended waited for its spare's two forks and setup (2.3 ms of a 5.7 ms back-to-back
/// no-op); with two, the next call's spare was forked while the previous script ran.
const SPARES_AHEAD: usize = 2;

/// Executions prepared ahead per server (staging dir, channel and, in strict mode, a spare
/// confined to them). With one, a strict call that came right after the previous one ended
/// found the next area still being prepared and did it all itself; with two, it takes the one
/// prepared while the previous script ran.
const PREPARED_AHEAD: usize = 2;

/// Failed starts after which a key is no longer served by a fork server.
const MAX_FAILURES: u32 = 3;

/// Servers kept at once; the least recently used one is stopped beyond this.
const MAX_SERVERS: usize = 4;

/// Why a fork server could not start or serve a request.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    /// Setting up a launch (staging dir, channel, confinement) failed as it would cold.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A socket or pipe could not be made or used.
    #[error("the fork server's channel failed: {0}")]
    Channel(String),
    /// The server exited or never became ready.
    #[error("the fork server is gone ({0}); calls start cold or from the pool")]
    Gone(String),
    /// The server refused a request.
    #[error("the fork server refused the request: {0}")]
    Refused(String),
    /// The call cannot be served by a forked process (the reason is logged, the call starts
    /// another way).
    #[error("not served by the fork server: {0}")]
    Unsuitable(String),
}

/// One running fork server.
struct Server {
    key: LaunchKey,
    /// The environment it started with, computed for `empty` as its staging dir.
    startup_env: Vec<(OsString, OsString)>,
    /// The environment its process has: `startup_env` without what a strict server must not
    /// start with. Each request carries only its differences from it ([`env_delta`]).
    process_env: HashMap<OsString, OsString>,
    /// An empty dir standing in for the staging dir in the server's own environment, and the
    /// server's cwd. Made in the staging area, which tools never reach: a strict script whose
    /// session dir holds TMPDIR must not plant modules where a root server imports from.
    empty: tempfile::TempDir,
    /// Removes the staging area's parent when `empty` was the last dir in it (drops after it).
    _parent: crate::confine::staging::ParentCleanup,
    control: Mutex<Option<OwnedFd>>,
    /// The ids of the requests for spares whose answers (a spare's pidfd and channels) have
    /// not been taken yet, oldest first; the answers wait on `control`, in the same order.
    /// Locked after `control`.
    asked: Mutex<std::collections::VecDeque<u64>>,
    child: Mutex<std::process::Child>,
    /// What its interpreter's startup read; a change starts a new server.
    fingerprint: crate::startup_files::Fingerprint,
    last_used: AtomicU64,
    /// The next executions' staging dirs and channels (up to [`PREPARED_AHEAD`]), prepared
    /// after the previous one ended, oldest first.
    ready: Mutex<std::collections::VecDeque<Prepared>>,
    /// A thread is filling `ready`.
    preparing: AtomicBool,
}

/// A staging dir (disk-budget tmpfs included) with its RPC channel and, in strict mode, its
/// confinement (uid lease, staging dir handed over, landlock ruleset, seccomp programs, reveal
/// plan), made before the execution that uses it is asked for.
///
/// This is exactly what a cold launch prepares, only earlier: nothing runs in the dir until it
/// is used, no process of the leased uid exists (the lease is exclusive and was taken when no
/// task had that uid), and the script and stub are written at use with `O_EXCL|O_NOFOLLOW` and
/// chowned to that uid, as the pool writes into its waiting interpreters' dirs. An area is used
/// once; one that is never used is removed with its server or at the host's exit.
struct Prepared {
    /// A spare taken for this area ahead of its call ([`arm`]): its reaper holds the
    /// execution's part and, in strict mode, its script process has applied the area's
    /// confinement. First, so it is killed before the area it was armed for is removed.
    armed: Option<Armed>,
    staging: Staging,
    channel: Channel,
    /// The stub already written into `staging` (with the runtime beside it): the one the
    /// previous execution of this key used, which the next one almost always uses too.
    stub: Option<Arc<str>>,
    /// `script.py`, created empty and left open when the area was prepared: creating a file
    /// on ext4 (an inode allocation that reads the inode table) cost a call a tenth of a
    /// millisecond or more, where writing into an open one costs a few microseconds. Nothing
    /// of any script has run in the area before its request, so the file waits unread.
    script: Option<std::fs::File>,
    /// The script's stdout and stderr pipes (read end, write end), made with the area: two
    /// `pipe2` calls off the call's path.
    stdout: (OwnedFd, OwnedFd),
    stderr: (OwnedFd, OwnedFd),
}

/// A spare armed for one prepared area ([`arm`]): its reaper was sent its part of the
/// execution (lifeline, status pipe, kill grace, the area's staging dir) when the area was
/// prepared, so a call sends only the script process's request. That send was the second of
/// two on a warm call's path, and the reaper's wake-up it caused, just before the script
/// process's, cost the script process 0.15 ms of its own wake-up when calls come paced.
/// Its kill grace is the call's: the grace is part of the server's key. Dropped unused (the
/// area is removed with its server), it is killed.
struct Armed {
    /// Empty once the call took it.
    spare: KilledIfDropped,
    /// Whether its script process was sent the area's confinement (strict mode).
    confined: bool,
    /// The supervisor's ends of the reaper's part.
    lifeline: crate::reaper::Lifeline,
    status: OwnedFd,
    /// The request its script process was sent ahead and has settled into ([`preset`]): a
    /// call whose request is the same sends only [`GO`].
    preset: Option<Vec<u8>>,
    /// The environment of that request.
    preset_env: Option<ScriptEnv>,
    /// Whether a call has woken its script process ahead of its request ([`wake_ahead`]).
    woken: bool,
}

impl Armed {
    /// Whether its reaper has exited (its pidfd is readable): killed while it waited, say.
    fn is_gone(&self) -> bool {
        self.spare
            .0
            .as_ref()
            .is_none_or(|s| poll_in(s.pidfd.as_raw_fd(), Duration::ZERO))
    }
}

/// An armed spare, killed if dropped: its reaper no longer waits on the channel whose EOF
/// would end it.
struct KilledIfDropped(Option<Spare>);

impl Drop for KilledIfDropped {
    fn drop(&mut self) {
        if let Some(spare) = self.0.take() {
            spare.kill();
        }
    }
}

/// One execution's processes, forked by the server before their request: the reaper, set up as
/// far as it can be without the request and waiting on `to_reaper`, and below it the script
/// process, waiting on `to_script`. The supervisor sends each its part of the request directly,
/// so the server never sees a request, and a call costs two sends to processes that already
/// exist. Dropping a spare unused closes both channels, and both processes exit at that EOF.
struct Spare {
    /// The reaper's pid and a pidfd opened by the server before it could reap that process.
    pid: u32,
    pidfd: OwnedFd,
    to_reaper: OwnedFd,
    to_script: OwnedFd,
    /// Whether the reaper served an execution before and handed itself back (`_hand_back` in
    /// zygote_boot.py) rather than being forked for this one.
    recycled: bool,
}

impl Spare {
    /// Kills a spare whose channels refused its request (it died or is dying).
    fn kill(self) {
        // SAFETY: pidfd_send_signal on a pidfd we own, with no siginfo and no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            );
        }
    }
}

/// Prepares the staging dir and channel of one execution of `spec` (everything but the script),
/// with `stub` and the runtime written if given.
fn prepare(spec: &LaunchSpec, stub: Option<Arc<str>>) -> Result<Prepared, ZygoteError> {
    let mut staging = Staging::create(spec.disk_budget())?;
    let channel = open_channel(spec, &mut staging)?;
    if let Some(text) = &stub {
        staging.write_stub(text, channel.owner)?;
    }
    let script = Some(staging.create_script(channel.owner)?);
    let (stdout, stderr) = (pipe()?, pipe()?);
    Ok(Prepared {
        armed: None,
        staging,
        channel,
        stub,
        script,
        stdout,
        stderr,
    })
}

/// The confinement part of a strict execution's request for its script process: limits, mount
/// plan, credentials, the seccomp programs' lengths and the syscall numbers the bootstrap calls
/// by number; and the programs themselves, their `struct sock_filter` arrays back to back in
/// this machine's byte order, which go after the message's JSON and a NUL (`_request` in
/// zygote_boot.py). The child hands each to the kernel as it is: encoding a thousand
/// instructions as text cost the host and the child a few hundred microseconds per execution.
/// Its descriptors are the RPC end and the landlock ruleset, in that order.
fn confinement_part(c: &ChildConfinement) -> (serde_json::Value, Vec<u8>) {
    let mut programs = Vec::with_capacity(c.filters.iter().map(|p| p.len() * 8).sum());
    for i in c.filters.iter().flatten() {
        programs.extend_from_slice(&i.code.to_ne_bytes());
        programs.extend_from_slice(&[i.jt, i.jf]);
        programs.extend_from_slice(&i.k.to_ne_bytes());
    }
    let part = serde_json::json!({
        "reveal": c.reveal.as_ref().map(|r| r.steps()),
        "rlimits": c.rlimits.iter().map(|(r, v)| (*r as u64, *v)).collect::<Vec<_>>(),
        "credentials": c.credentials.map(|cr| [cr.uid, cr.gid]),
        "filters": c.filters.iter().map(Vec::len).collect::<Vec<_>>(),
        "syscalls": {
            "landlock_restrict_self": libc::SYS_landlock_restrict_self,
            "seccomp": libc::SYS_seccomp,
            "open_tree": libc::SYS_open_tree,
            "move_mount": libc::SYS_move_mount,
        },
    });
    (part, programs)
}

/// A script process's message: `json`, then a NUL and `programs` if there are any.
fn with_programs(json: &serde_json::Value, programs: &[u8]) -> Vec<u8> {
    let mut body = json.to_string().into_bytes();
    if !programs.is_empty() {
        body.push(0);
        body.extend_from_slice(programs);
    }
    body
}

/// The reaper's part of a request: its kill grace and the staging dir it sweeps if its
/// supervisor dies (`_receive_part` in zygote_boot.py). Its descriptors are the lifeline's read
/// end and the status pipe's write end, in that order.
fn reaper_part(grace: Duration, staging: &std::path::Path) -> String {
    serde_json::json!({
        "grace_ms": grace.as_millis() as u64,
        "staging": staging,
    })
    .to_string()
}

/// Arms `spare` for `prepared`: sends its reaper its part of the execution ([`Armed`]), with
/// `grace` as the kill grace; in strict mode, also sends its script process the area's
/// confinement, which it applies while it waits for its request (`_take_confinement` in
/// zygote_boot.py). A strict execution then costs what a project one does between its request
/// and its script: the mount namespace, uid change, landlock and seccomp steps (over a
/// millisecond and a half, most of it the kernel checking and compiling the filters) and the
/// host's encoding of them happen after the previous execution, not during the call.
///
/// The armed reaper waits for its script process, which runs nothing but the bootstrap's
/// receive loop until its request comes; a confined one holds only stdio, its channel, the RPC
/// end and (until landlock takes it) the ruleset, and is the only process of the area's leased
/// uid. Both are killed if the area is dropped unused.
fn arm(
    spare: Spare,
    staging: &Staging,
    confinement: Option<&ChildConfinement>,
    grace: Duration,
) -> Result<Armed, ZygoteError> {
    let staging = staging.path();
    let pipes = lifeline(grace, Some(staging))
        .map_err(|e| ZygoteError::Channel(format!("lifeline: {e}")))
        .and_then(|l| Ok((l, pipe()?)));
    let ((lifeline, _setup, lifeline_read), (status, status_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            spare.kill();
            return Err(e);
        }
    };
    if let Err(e) = send(
        &spare.to_reaper,
        reaper_part(grace, staging).as_bytes(),
        &[lifeline_read.as_raw_fd(), status_w.as_raw_fd()],
    ) {
        spare.kill();
        return Err(e);
    }
    let to_script = spare.to_script.as_raw_fd();
    let mut armed = Armed {
        spare: KilledIfDropped(Some(spare)),
        confined: false,
        lifeline,
        status,
        preset: None,
        preset_env: None,
        woken: false,
    };
    let Some(c) = confinement else {
        return Ok(armed);
    };
    let (mut part, programs) = confinement_part(c);
    // The covers as a namespace made once per plan: the spare enters it and unshares its own
    // copy instead of building them (docs/strict-mode.md, "One mount namespace per plan").
    let template = c
        .reveal
        .as_ref()
        .and_then(|plan| crate::confine::reveal::template_for(plan, staging));
    let mut fds = vec![c.rpc.as_raw_fd(), c.ruleset.as_raw_fd()];
    if let Some(ns) = &template {
        fds.push(ns.as_raw_fd());
        part["template_staging"] = serde_json::Value::from(staging.to_string_lossy().as_ref());
    }
    let body = with_programs(&serde_json::json!({ "confine": part }), &programs);
    // Dropped (killed) with `armed` if this fails.
    send_fd(to_script, &body, &fds)?;
    armed.confined = true;
    Ok(armed)
}

/// Prepares the next executions of `server`'s key on the preparer thread, until
/// [`PREPARED_AHEAD`] are ready, unless it is at it already: the strict steps that cost most in
/// the supervisor (the landlock ruleset over the interpreter's paths, the uid lease with its
/// scan of `/proc`, the tmpfs mount) and in the script process (its confinement, [`arm`])
/// then happen while the previous script runs, not between a request and its fork. The thread
/// first asks the server for the spares the next calls take ([`ask_ahead`]): an execution's end
/// has both done there rather than on the thread about to return its result, where the server's
/// wake-up (it forks at once) cost a warm call about 0.1 ms.
fn prepare_next(server: &Arc<Server>, spec: LaunchSpec, stub: Option<Arc<str>>) {
    let prepare = lock(&server.ready).len() < PREPARED_AHEAD
        && !server.preparing.swap(true, Ordering::SeqCst);
    let job = PrepareJob {
        server: Arc::clone(server),
        spec,
        stub,
        prepare,
    };
    let mut preparer = lock(&PREPARER);
    if preparer.is_none() {
        *preparer = start_preparer();
    }
    QUEUED.fetch_add(1, Ordering::SeqCst);
    let refused = match preparer.as_ref() {
        Some(queue) => queue.send(job).err().map(|back| back.0),
        None => Some(job),
    };
    if refused.is_some() {
        QUEUED.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some(job) = refused {
        // No thread to do it: the spares are asked for here, and the next call prepares its
        // own area, as on a cold server.
        *preparer = None;
        ask_ahead(&job.server);
        if job.prepare {
            job.server.preparing.store(false, Ordering::SeqCst);
        }
    }
}

/// One server's request for its spares and areas prepared ahead.
struct PrepareJob {
    server: Arc<Server>,
    spec: LaunchSpec,
    stub: Option<Arc<str>>,
    /// Prepare areas ([`prepare_ahead`]); this job set the server's `preparing` flag.
    prepare: bool,
}

/// The preparer thread's queue, started at the first request. One thread for every server,
/// kept for the host's life: a thread started per execution cost its clone and its exit on
/// the path of the call that asked for it, and two keys preparing at once on two cores only
/// took CPU from running scripts.
static PREPARER: Mutex<Option<std::sync::mpsc::Sender<PrepareJob>>> = Mutex::new(None);
/// Jobs sent to the preparer that it has not started yet.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Starts the preparer; `None` if no thread can be started.
fn start_preparer() -> Option<std::sync::mpsc::Sender<PrepareJob>> {
    let (queue, jobs) = std::sync::mpsc::channel::<PrepareJob>();
    std::thread::Builder::new()
        .name("vibeos-zygote-prepare".into())
        .spawn(move || {
            // Below the host's other threads: this work is for the next call.
            crate::background::lower_this_thread();
            for job in jobs {
                QUEUED.fetch_sub(1, Ordering::SeqCst);
                ask_ahead(&job.server);
                if job.prepare {
                    prepare_ahead(&job);
                    job.server.preparing.store(false, Ordering::SeqCst);
                }
            }
        })
        .map_err(|e| tracing::debug!("execute_code: no thread to prepare executions ahead: {e}"))
        .ok()?;
    Some(queue)
}

/// Prepares (and in strict mode primes) areas for `job`'s server until [`PREPARED_AHEAD`] are
/// ready, the host exits, or a preparation fails (the next call then reports it).
fn prepare_ahead(job: &PrepareJob) {
    let server = &job.server;
    while !EXITING.load(Ordering::SeqCst) && lock(&server.ready).len() < PREPARED_AHEAD {
        // Calls that ended while an area was being prepared queued their asks behind it.
        ask_ahead(server);
        match prepare(&job.spec, job.stub.clone()) {
            Ok(mut p) => {
                // A strict area is armed before it is offered: its confinement is the costly
                // part of a strict call. A project one is offered at once and armed below, once
                // a spare is there: a call that comes before then takes it as it is.
                if p.channel.confinement.is_some() {
                    let armed = take_spare(server).and_then(|spare| {
                        arm(
                            spare,
                            &p.staging,
                            p.channel.confinement.as_ref(),
                            job.spec.kill_grace,
                        )
                    });
                    match armed {
                        Ok(armed) => p.armed = Some(preset(armed, &job.spec, &p, server)),
                        // The call arms a spare itself.
                        Err(e) => tracing::debug!("execute_code: arming a spare ahead: {e}"),
                    }
                }
                let mut ready = lock(&server.ready);
                if ready.len() >= PREPARED_AHEAD || EXITING.load(Ordering::SeqCst) {
                    break;
                }
                ready.push_back(p);
            }
            Err(e) => {
                tracing::debug!("execute_code: preparing the next execution: {e}");
                break;
            }
        }
    }
    arm_ready(job);
}

/// How long the preparer waits for spares to arm areas with, at most, and how long at a time
/// before it looks whether another job came: calls that come back to back take the spares
/// first, and the asks of the jobs their ends queued must not wait behind this one.
const ARM_WAIT: Duration = Duration::from_millis(200);
const ARM_SLICE: Duration = Duration::from_millis(2);

/// Arms the prepared areas that have no spare yet ([`arm`]) as spares come, while no other job
/// waits. An area a call took meanwhile is not waited for; a spare taken for it arms a new area
/// instead.
fn arm_ready(job: &PrepareJob) {
    let server = &job.server;
    let unarmed = || lock(&server.ready).iter().any(|p| p.armed.is_none());
    let Some(watched) = lock(&server.control)
        .as_ref()
        .and_then(|c| c.try_clone().ok())
    else {
        return;
    };
    let deadline = Instant::now() + ARM_WAIT;
    while !EXITING.load(Ordering::SeqCst)
        && QUEUED.load(Ordering::SeqCst) == 0
        && Instant::now() < deadline
        && unarmed()
        && !lock(&server.asked).is_empty()
    {
        let Some(spare) = spare_when_ready(server, &watched, ARM_SLICE) else {
            continue;
        };
        let mut ready = lock(&server.ready);
        if let Some(p) = ready.iter_mut().find(|p| p.armed.is_none()) {
            match arm(
                spare,
                &p.staging,
                p.channel.confinement.as_ref(),
                job.spec.kill_grace,
            ) {
                Ok(armed) => p.armed = Some(preset(armed, &job.spec, p, server)),
                Err(e) => {
                    tracing::debug!("execute_code: arming a spare ahead: {e}");
                    return;
                }
            }
            continue;
        }
        drop(ready);
        let mut p = match prepare(&job.spec, job.stub.clone()) {
            Ok(p) => p,
            Err(e) => {
                spare.kill();
                tracing::debug!("execute_code: preparing the next execution: {e}");
                return;
            }
        };
        match arm(
            spare,
            &p.staging,
            p.channel.confinement.as_ref(),
            job.spec.kill_grace,
        ) {
            Ok(armed) => p.armed = Some(preset(armed, &job.spec, &p, server)),
            Err(e) => {
                tracing::debug!("execute_code: arming a spare ahead: {e}");
                return;
            }
        }
        let mut ready = lock(&server.ready);
        if ready.len() < PREPARED_AHEAD && !EXITING.load(Ordering::SeqCst) {
            ready.push_back(p);
        }
    }
}

/// Set at the host's exit: prepared areas are removed, no new ones are kept.
static EXITING: AtomicBool = AtomicBool::new(false);
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// Removes the prepared staging dirs (and their tmpfs mounts) at the host's normal exit; the
/// servers themselves end when the kernel closes their control channels.
extern "C" fn clean_up_at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    // An execution that ended as the host stopped (a client that hung up mid-script) starts
    // preparing the next area just as the process exits, and exit would stop that thread
    // halfway through and leave its dir. Such a thread sees EXITING when it is done and removes
    // its area itself: wait for it, a bounded time, and never on a lock.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let preparing = match REGISTRY.try_lock() {
            Ok(reg) => reg
                .as_ref()
                .is_some_and(|r| r.servers.iter().any(|s| s.preparing.load(Ordering::SeqCst))),
            Err(_) => false,
        };
        if !preparing {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Never block at exit: a lock held by a thread that exit() froze would hang the process.
    let Ok(reg) = REGISTRY.try_lock() else { return };
    let Some(reg) = reg.as_ref() else { return };
    for server in &reg.servers {
        if let Ok(mut ready) = server.ready.try_lock() {
            ready.clear();
        }
        // The registry is a static, so the servers are never dropped and their empty dirs
        // would stay in TMPDIR. The server, ending at its channel's EOF, needs it no more.
        let _ = std::fs::remove_dir(server.empty.path());
        if let Some(parent) = server.empty.path().parent() {
            drop(crate::confine::staging::ParentCleanup(parent.to_path_buf()));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // EOF on its control channel ends the server; children already forked go on (their
        // lifelines belong to their executions).
        // A spare whose answer was never read goes with the channel's queue: its channels
        // close with it, and its processes exit at that EOF.
        drop(lock(&self.control).take());
        lock(&self.ready).clear();
        let mut child = lock(&self.child);
        if !matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Registry {
    servers: Vec<Arc<Server>>,
    failures: Vec<(LaunchKey, u32)>,
    /// Keys whose server is being started (outside the lock).
    starting: Vec<(LaunchKey, Arc<Starting>)>,
}

/// A server start in progress, which calls of the same key wait for (bounded).
#[derive(Default)]
struct Starting {
    done: Mutex<bool>,
    over: std::sync::Condvar,
}

impl Starting {
    fn wait(&self, limit: Duration) {
        let done = lock(&self.done);
        let _ = self
            .over
            .wait_timeout_while(done, limit, |done| !*done)
            .map_err(|p| p.into_inner());
    }
}

/// Marks a start as over when dropped.
struct Release<'a>(&'a Starting);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        *lock(&self.0.done) = true;
        self.0.over.notify_all();
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static CLOCK: AtomicU64 = AtomicU64::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);
static CONFINED_AHEAD: AtomicU64 = AtomicU64::new(0);
static ARMED_AHEAD: AtomicU64 = AtomicU64::new(0);
static PRESET_TAKEN: AtomicU64 = AtomicU64::new(0);
static WOKEN_AHEAD: AtomicU64 = AtomicU64::new(0);
static RECYCLED: AtomicU64 = AtomicU64::new(0);
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);
/// Bumped whenever the servers are turned off, so a server whose start began before is dropped.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Turns the process-wide fork servers on or off. Off (the default), executions start from the
/// pool or cold; on, every local execution of this process whose key a server can serve is
/// forked from that key's server (started at the first such call). Turning it off stops the
/// servers; executions already forked are not affected.
pub fn set_enabled(on: bool) {
    if on {
        vibeos_tools::exit_hook::register(
            &AT_EXIT,
            clean_up_at_exit,
            "the fork servers' prepared staging dirs may be left in TMPDIR at exit",
        );
    }
    ENABLED.store(on, Ordering::SeqCst);
    if !on {
        EPOCH.fetch_add(1, Ordering::SeqCst);
        let old = lock(&REGISTRY).take();
        if let Some(old) = &old {
            // A thread still preparing a server's next staging area holds the server: wait for
            // it (bounded), so the server ends here rather than in that thread, perhaps after
            // this process has exited and left the server's dir in TMPDIR.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && old.servers.iter().any(|s| Arc::strong_count(s) > 1)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(old);
        // Nothing made for the servers outlives them.
        crate::confine::reveal::drop_templates();
    }
}

/// Whether fork servers are on in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Executions forked by a fork server in this process so far.
pub fn forks() -> u64 {
    FORKS.load(Ordering::SeqCst)
}

/// Mount namespaces made as templates of a reveal plan so far, one per plan
/// (`confine::reveal::template_for`): a strict spare enters one and unshares its own copy.
pub fn mount_templates_made() -> u64 {
    crate::confine::reveal::templates_made()
}

/// Executions so far whose reaper was sent its part before their request came ([`arm`]).
pub fn armed_ahead() -> u64 {
    ARMED_AHEAD.load(Ordering::SeqCst)
}

/// Executions so far whose script process had settled ahead into the very request their call
/// made (the call sent only "go"; zygote.rs `preset`).
pub fn presets_taken() -> u64 {
    PRESET_TAKEN.load(Ordering::SeqCst)
}

/// Spares woken so far by a call on its way ([`wake_ahead`]).
pub fn woken_ahead() -> u64 {
    WOKEN_AHEAD.load(Ordering::SeqCst)
}

/// Strict executions so far whose script process was confined before their request came
/// ([`arm`]).
pub fn confined_ahead() -> u64 {
    CONFINED_AHEAD.load(Ordering::SeqCst)
}

/// Executions so far whose reaper had served an earlier execution of this process and was
/// handed back to its server, instead of being forked for this one.
pub fn recycled_reapers() -> u64 {
    RECYCLED.load(Ordering::SeqCst)
}

/// Starts the server for calls like `request` ahead of the first one; errors are left for the
/// call itself to report. Returns whether a server is ready for it.
pub fn prewarm(request: &crate::ExecutionRequest) -> bool {
    if !enabled() {
        return false;
    }
    match LaunchSpec::for_request(request) {
        Ok(spec) => server_for(&spec).is_ok(),
        Err(_) => false,
    }
}

/// What a waiting script process is told when a call is on its way (zygote_boot.py `_WAKE`).
const WAKE: &[u8] = b"wake\0";
/// How long the fork servers must have forked nothing for a call to wake a spare ahead.
const WAKE_AFTER: Duration = Duration::from_millis(25);

/// Tells the spare the next call most likely takes (the front of the last used server's
/// areas) that a call is on its way, when the servers have been idle for a while: its script
/// process leaves its wait and watches its channel until the request comes (for a few
/// milliseconds at most), instead of sleeping through the call's first steps here.
///
/// An idle CPU of these machines takes 0.1–0.3 ms to run a process woken on it (its virtual
/// CPU was halted), which a paced call paid when its request reached the script process; the
/// wake-up now happens while the call is still being prepared. A call that comes while others
/// run, or right after one, wakes nothing: a CPU is busy then anyway. A spare woken for a
/// call that then takes another one only went back to waiting a little later. Nor does a
/// host that may use a single CPU wake anything: the watching process would take turns with
/// the call's own preparation.
pub fn wake_ahead() {
    if !enabled() || !more_than_one_cpu() || !crate::fork_activity::idle_for(WAKE_AFTER) {
        return;
    }
    let server = lock(&REGISTRY).as_ref().and_then(|r| {
        r.servers
            .iter()
            .max_by_key(|s| s.last_used.load(Ordering::SeqCst))
            .cloned()
    });
    let Some(server) = server else {
        return;
    };
    let mut ready = lock(&server.ready);
    let Some(armed) = ready.front_mut().and_then(|p| p.armed.as_mut()) else {
        return;
    };
    if armed.woken {
        return;
    }
    if let Some(spare) = armed.spare.0.as_ref() {
        // As a preset is sent: the spare reads every message, and takes at most one wake-up.
        armed.woken = send(&spare.to_script, WAKE, &[]).is_ok();
        if armed.woken {
            WOKEN_AHEAD.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Whether this process may run on more than one CPU (its affinity and CPU quota counted),
/// taken once.
fn more_than_one_cpu() -> bool {
    static MANY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MANY.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// Forks the execution for `spec` from its key's server. `None` means "start another way"
/// (servers off, or this call cannot be served by one; the reason is logged).
pub(crate) fn start(spec: &LaunchSpec, stub: &str, code: &str) -> Option<Launched> {
    if !enabled() {
        return None;
    }
    let server = match server_for(spec) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("execute_code: {e}");
            return None;
        }
    };
    match fork(&server, spec, stub, code) {
        Ok(l) => {
            FORKS.fetch_add(1, Ordering::SeqCst);
            Some(l)
        }
        Err(e) => {
            tracing::debug!("execute_code: {e}");
            if matches!(e, ZygoteError::Gone(_) | ZygoteError::Channel(_)) {
                forget(&server);
            }
            None
        }
    }
}

/// [`start`] for an async caller: a call that first has to start its key's server (which may
/// take up to [`READY_TIMEOUT`]) does that on a blocking thread, so no runtime worker, and with
/// it no other execution or request of the host, waits for the start.
pub(crate) async fn start_async(spec: &LaunchSpec, stub: &str, code: &str) -> Option<Launched> {
    if !enabled() {
        return None;
    }
    if has_server(spec) {
        return start(spec, stub, code);
    }
    let (spec, stub, code) = (spec.clone(), stub.to_owned(), code.to_owned());
    tokio::task::spawn_blocking(move || start(&spec, &stub, &code))
        .await
        .ok()
        .flatten()
}

/// Whether a server for `spec`'s key is registered (it may still turn out stale).
fn has_server(spec: &LaunchSpec) -> bool {
    let key = spec.key();
    lock(&REGISTRY)
        .as_ref()
        .is_some_and(|r| r.servers.iter().any(|s| s.key == key))
}

fn forget(server: &Arc<Server>) {
    let removed = {
        let mut reg = lock(&REGISTRY);
        reg.as_mut().and_then(|r| {
            r.servers
                .iter()
                .position(|s| Arc::ptr_eq(s, server))
                .map(|i| r.servers.remove(i))
        })
    };
    drop(removed);
}

/// The server for `spec`'s key, started if needed (or restarted when a variable the
/// interpreter reads at startup changed).
///
/// The registry lock is held only to look up and record servers, never while one starts (which
/// may take up to [`READY_TIMEOUT`]): calls for other keys go on meanwhile, and a call for a key
/// whose server is still starting waits for it at most [`STARTING_WAIT`], then starts from the
/// pool or cold.
fn server_for(spec: &LaunchSpec) -> Result<Arc<Server>, ZygoteError> {
    if spec.mode == Mode::Strict && spec.strict.uid.is_some() {
        // A pinned uid is one uid for every execution: concurrent ones would share it.
        return Err(ZygoteError::Unsuitable("strict.uid is pinned".into()));
    }
    let key = spec.key();
    let epoch = EPOCH.load(Ordering::SeqCst);
    let mut stale = Vec::new();
    let mut waited = false;
    let starting = loop {
        let mut guard = lock(&REGISTRY);
        let reg = guard.get_or_insert_with(Registry::default);
        if reg
            .failures
            .iter()
            .any(|(k, n)| *k == key && *n >= MAX_FAILURES)
        {
            return Err(ZygoteError::Unsuitable(
                "its fork server failed to start repeatedly".into(),
            ));
        }
        if let Some((_, starting)) = reg.starting.iter().find(|(k, _)| *k == key) {
            if waited {
                return Err(ZygoteError::Unsuitable(
                    "its fork server is still starting".into(),
                ));
            }
            let starting = Arc::clone(starting);
            drop(guard);
            starting.wait(STARTING_WAIT);
            waited = true;
            continue;
        }
        if let Some(i) = reg.servers.iter().position(|s| s.key == key) {
            let s = Arc::clone(&reg.servers[i]);
            let wanted = spec.child_env(s.empty.path(), false)?;
            if startup_names(&wanted) == startup_names(&s.startup_env)
                && s.fingerprint.still_holds(&spec.interpreter.path)
                && !exited(&s)
            {
                s.last_used
                    .store(CLOCK.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
                return Ok(s);
            }
            stale.push(reg.servers.remove(i));
        }
        let starting = Arc::new(Starting::default());
        reg.starting.push((key.clone(), Arc::clone(&starting)));
        break starting;
    };
    // Waiters are released however this ends (the registry is updated first).
    let _release = Release(&starting);
    // Stopping a server waits for its process: not under the lock either.
    drop(std::mem::take(&mut stale));
    if spec.mode == Mode::Strict {
        if let Some(why) = crate::startup_files::strict_server_refusal(spec) {
            log_refusal_once(&why);
            return Err(ZygoteError::Unsuitable(why));
        }
    }
    let started = start_server(spec);
    let mut guard = lock(&REGISTRY);
    let current = EPOCH.load(Ordering::SeqCst) == epoch;
    let Some(reg) = guard.as_mut().filter(|_| current) else {
        // Servers were turned off while this one started: it must not outlive that.
        drop(guard);
        drop(started);
        return Err(ZygoteError::Gone(
            "fork servers were turned off while it started".into(),
        ));
    };
    reg.starting.retain(|(k, _)| *k != key);
    let server = match started {
        Ok(s) => Arc::new(s),
        Err(e) => {
            match reg.failures.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => reg.failures.push((key, 1)),
            }
            return Err(e);
        }
    };
    reg.failures.retain(|(k, _)| *k != key);
    reg.servers.push(Arc::clone(&server));
    while reg.servers.len() > MAX_SERVERS {
        let lru = reg
            .servers
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.last_used.load(Ordering::SeqCst))
            .map(|(i, _)| i);
        match lru {
            Some(i) => stale.push(reg.servers.remove(i)),
            None => break,
        }
    }
    drop(guard);
    drop(stale);
    Ok(server)
}

/// Logs why strict calls of a kind start cold, once per reason (a host makes many calls).
fn log_refusal_once(why: &str) {
    static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut logged = lock(&LOGGED);
    if !logged.iter().any(|w| w == why) {
        tracing::info!("execute_code: no fork server for strict calls: {why}");
        logged.push(why.to_owned());
    }
}

fn exited(s: &Server) -> bool {
    !matches!(lock(&s.child).try_wait(), Ok(None))
}

/// The variables the interpreter reads at startup, with their values.
fn startup_names(env: &[(OsString, OsString)]) -> Vec<(&OsString, &OsString)> {
    let mut v: Vec<_> = env
        .iter()
        .filter(|(k, _)| k.to_str().is_none_or(crate::env_policy::affects_startup))
        .map(|(k, v)| (k, v))
        .collect();
    v.sort();
    v
}

fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), ZygoteError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| ZygoteError::Channel(format!("socketpair: {e}")))
}

/// The name a fork server's dir starts with; the supervisor's pid follows, then a random part.
const SERVER_DIR_PREFIX: &str = "vibeos-zygote-";

/// Removes the empty fork-server dirs of supervisors that are gone from `parent`: a supervisor
/// killed with SIGKILL (or by the OOM killer) left its dir, one more per crash, and nothing else
/// removes it (an execution's staging dir has its reaper for that; a server's dir has none).
/// Only an empty dir is removed, and only of a pid that no longer runs (a reused pid keeps its
/// dir: an empty dir is all that is lost).
fn remove_dead_servers_dirs(parent: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SERVER_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn start_server(spec: &LaunchSpec) -> Result<Server, ZygoteError> {
    let empty = crate::confine::staging::create_dir_named(&format!(
        "{SERVER_DIR_PREFIX}{}-",
        std::process::id()
    ))
    .map_err(|e| ZygoteError::Channel(format!("cannot create the server's dir: {e}")))?;
    if let Some(parent) = empty.path().parent() {
        remove_dead_servers_dirs(parent);
    }
    let parent = crate::confine::staging::ParentCleanup(
        empty
            .path()
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default(),
    );
    let startup_env = spec.child_env(empty.path(), false)?;
    let (ours, theirs) = seqpacket_pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let fingerprint = crate::startup_files::Fingerprint::of(&spec.interpreter.path);
    // Without the names the host passes through, which reach each execution in its request
    // (`LaunchSpec::warm_start_keeps`: the environment a process is exec'd with is in every
    // fork's memory).
    // A strict server is root: nothing on PYTHONPATH (which a strict script may be able to
    // write) may load while it starts; each child puts the entries back (zygote_boot.py).
    let process_env: HashMap<OsString, OsString> = startup_env
        .iter()
        .filter(|(k, _)| spec.warm_start_keeps(k))
        .filter(|(k, _)| spec.mode != Mode::Strict || k != "PYTHONPATH")
        .cloned()
        .collect();
    let mut command = std::process::Command::new(&spec.interpreter.path);
    command
        // No `site` at startup: the bootstrap runs it itself once its own imports are done,
        // without `sitecustomize`/`usercustomize`, which each child runs after its
        // confinement, as a cold start runs them (docs/warm-pool.md).
        .arg("-S")
        .arg("-u")
        .arg("-c")
        .arg(BOOT)
        .arg(theirs_fd.to_string())
        .arg(empty.path())
        .arg(vibeos_rpc::RUNTIME_SOURCE)
        .env_clear()
        .envs(
            startup_env
                .iter()
                .filter(|(k, _)| process_env.contains_key(k))
                .map(|(k, v)| (k, v)),
        )
        .current_dir(empty.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid and fcntl are async-signal-safe and act on this process and a descriptor
    // the parent keeps open until the spawn returns.
    unsafe {
        command.pre_exec(move || {
            // Its own session: a terminal's Ctrl-C or hangup is not meant for it.
            if libc::setsid() < 0 || libc::fcntl(theirs_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|source| StartError::Spawn {
        interpreter: spec.interpreter.path.clone(),
        source,
    })?;
    drop(theirs);
    let server = Server {
        key: spec.key(),
        startup_env,
        process_env,
        empty,
        _parent: parent,
        control: Mutex::new(Some(ours)),
        asked: Mutex::new(std::collections::VecDeque::new()),
        child: Mutex::new(child),
        fingerprint,
        last_used: AtomicU64::new(CLOCK.fetch_add(1, Ordering::SeqCst)),
        ready: Mutex::new(std::collections::VecDeque::new()),
        preparing: AtomicBool::new(false),
    };
    let ready = {
        let control = lock(&server.control);
        let fd = control.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let mut byte = [0u8; 1];
        poll_in(fd, READY_TIMEOUT)
            // SAFETY: reading into a valid one-byte buffer from an open descriptor.
            && unsafe { libc::recv(fd, byte.as_mut_ptr().cast(), 1, 0) } == 1
            && byte[0] == b'R'
    };
    if !ready {
        return Err(ZygoteError::Gone(
            "it exited or was not ready in time; run a script cold to see the interpreter's error"
                .into(),
        ));
    }
    // The first call then finds its processes already forked.
    ask_ahead(&server);
    Ok(server)
}

fn pipe() -> Result<(OwnedFd, OwnedFd), ZygoteError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ZygoteError::Channel(format!("pipe: {e}")))
}

/// What a forked script process changes in the environment it inherits from its server
/// (`process`) to have exactly `env`: the variables to set, and the names to remove. A warm
/// call's request carries only these (a handful of names against the host's ninety-odd), which
/// the script process then applies in a few steps instead of comparing everything.
fn env_delta<'a>(
    env: &'a [(OsString, OsString)],
    process: &'a HashMap<OsString, OsString>,
) -> Result<(Vec<[&'a str; 2]>, Vec<&'a str>), ZygoteError> {
    // A name given twice takes its last value, as it does in a process's environment.
    let mut names: HashSet<&OsString> = HashSet::with_capacity(env.len());
    let mut set = Vec::new();
    for (k, v) in env.iter().rev() {
        if names.insert(k) && process.get(k) != Some(v) {
            set.push([text(k)?, text(v)?]);
        }
    }
    set.reverse();
    let mut unset = Vec::new();
    for k in process.keys().filter(|k| !names.contains(k)) {
        unset.push(text(k)?);
    }
    Ok((set, unset))
}

/// An execution's environment, name and value.
type ScriptEnv = Vec<(OsString, OsString)>;

/// The script's environment (`tool_env` with the channel's variables) and its process's
/// request for `staging`'s execution as `spec` asks for it: that environment as its difference
/// from the server's own, its working dir and paths ([`script_request`]).
fn request_body(
    spec: &LaunchSpec,
    staging: &Staging,
    tool_env: ScriptEnv,
    channel_vars: &[(OsString, OsString)],
    server: &Server,
) -> Result<(ScriptEnv, Vec<u8>), ZygoteError> {
    let env = with_channel(tool_env, channel_vars);
    let (set, unset) = env_delta(&env, &server.process_env)?;
    let body = script_request(
        &spec.child_cwd(staging.path()),
        staging.path(),
        &staging.path().join("script.py"),
        &set,
        &unset,
    )?;
    Ok((env, body))
}

/// What a preset script process is told when its call's request is the one it was preset
/// with; it comes with stdout and stderr, as a request does, and the script's bytes follow it
/// when they are at most [`INLINE_SOURCE`] long (the process then reads no file for them).
const GO: &[u8] = b"go\0";
/// The largest script sent along with [`GO`]: well inside what one message on a local
/// SEQPACKET socket takes, and the script process's receive buffer.
const INLINE_SOURCE: usize = 64 << 10;
/// [`GO`], with `code` after it when it is short enough to come along.
fn go_message(code: &str) -> Vec<u8> {
    let mut message = GO.to_vec();
    if code.len() <= INLINE_SOURCE {
        message.extend_from_slice(code.as_bytes());
    }
    message
}

/// What a preset request starts with (zygote_boot.py `_PRESET`); a request's first field is
/// an absolute path, so neither can be taken for one.
const PRESET: &[u8] = b"preset\0";

/// Sends `armed`'s script process, while it waits, the request a call like the last one
/// (`spec`) would send for `prepared`: it settles into it (working dir, environment,
/// `sys.path`, the stub runtime's hand-over, fresh random state; zygote_boot.py `_settle`)
/// before the call comes. A call whose request turns out the same (the same environment and
/// working dir, as nearly every call of a long-lived host) then sends only [`GO`] with stdout
/// and stderr, and its script process goes straight to the script; any other request undoes
/// the preset first. Nothing is sent if the request cannot be made or sent: the call then
/// sends its whole request, as to a spare armed on its own path.
///
/// Only an environment the server itself started with is preset (apart from what belongs to
/// the area: its staging dir, its channel): an undone preset would leave its values in the
/// freed memory of the process that runs the next call, which a script can read, and a host
/// may give each caller its own environment. A call whose environment differs from its
/// spare's preset is run by a fresh spare instead ([`fork`]), so no preset is
/// undone under another environment.
fn preset(mut armed: Armed, spec: &LaunchSpec, prepared: &Prepared, server: &Server) -> Armed {
    let sorted = |mut env: ScriptEnv| {
        env.sort();
        env
    };
    let servers_own = spec
        .child_env(server.empty.path(), false)
        .is_ok_and(|env| sorted(env) == sorted(server.startup_env.clone()));
    if !servers_own {
        return armed;
    }
    let body = spec
        .child_env(prepared.staging.path(), false)
        .map_err(ZygoteError::from)
        .and_then(|tool_env| {
            request_body(
                spec,
                &prepared.staging,
                tool_env,
                &prepared.channel.channel_vars,
                server,
            )
        });
    let Some(spare) = armed.spare.0.as_ref() else {
        return armed;
    };
    match body {
        Ok((env, body)) => {
            let mut message = PRESET.to_vec();
            message.extend_from_slice(&body);
            match send(&spare.to_script, &message, &[]) {
                Ok(()) => {
                    armed.preset = Some(body);
                    armed.preset_env = Some(env);
                }
                Err(e) => tracing::debug!("execute_code: presetting a spare: {e}"),
            }
        }
        Err(e) => tracing::debug!("execute_code: presetting a spare: {e}"),
    }
    armed
}

/// A script process's request (`_request` in zygote_boot.py): its cwd, staging dir and script
/// path, the number of variables to set, each one's name and value, then the names to remove,
/// separated by NULs, which none of them can hold. One split reads it, where JSON's decoder cost
/// a forked script process 50–100 µs of code and pages it had not touched yet.
fn script_request(
    cwd: &std::path::Path,
    staging: &std::path::Path,
    script: &std::path::Path,
    set: &[[&str; 2]],
    unset: &[&str],
) -> Result<Vec<u8>, ZygoteError> {
    let path = |p: &std::path::Path| -> Result<String, ZygoteError> {
        p.to_str().map(str::to_owned).ok_or_else(|| {
            ZygoteError::Unsuitable(format!("the path {} is not UTF-8", p.display()))
        })
    };
    let count = set.len().to_string();
    let fields = [path(cwd)?, path(staging)?, path(script)?];
    let all = fields
        .iter()
        .map(String::as_str)
        .chain(std::iter::once(count.as_str()))
        .chain(set.iter().flatten().copied())
        .chain(unset.iter().copied());
    let mut body = Vec::new();
    for (i, field) in all.enumerate() {
        if field.contains('\0') {
            return Err(ZygoteError::Unsuitable(
                "a request field holds a NUL character".into(),
            ));
        }
        if i > 0 {
            body.push(0);
        }
        body.extend_from_slice(field.as_bytes());
    }
    Ok(body)
}

fn text(s: &OsString) -> Result<&str, ZygoteError> {
    s.to_str()
        .ok_or_else(|| ZygoteError::Unsuitable("an environment variable is not UTF-8".into()))
}

/// Sets up one execution as a cold launch would and has `server` fork it.
fn fork(
    server: &Arc<Server>,
    spec: &LaunchSpec,
    stub: &str,
    code: &str,
) -> Result<Launched, ZygoteError> {
    let ready = lock(&server.ready).pop_front();
    let Prepared {
        armed,
        staging,
        channel,
        stub: written,
        script,
        stdout: (out_r, out_w),
        stderr: (err_r, err_w),
    } = match ready {
        Some(p) => p,
        None => prepare(spec, None)?,
    };
    // The stub this execution uses, kept for the next one's preparation (shared, not copied,
    // while it stays the same).
    let stub: Arc<str> = match written {
        Some(w) if *w == *stub => w,
        Some(_) => {
            staging.replace_stub(stub, channel.owner)?;
            Arc::from(stub)
        }
        None => {
            staging.write_stub(stub, channel.owner)?;
            Arc::from(stub)
        }
    };
    match script {
        Some(mut file) => {
            std::io::Write::write_all(&mut file, code.as_bytes()).map_err(StartError::Staging)?
        }
        None => staging.write_script(code, channel.owner)?,
    }
    let Channel {
        rpc,
        token,
        channel_vars,
        confinement,
        owner,
    } = channel;
    let tool_env = spec.child_env(staging.path(), true)?;
    let (env, body) = request_body(spec, &staging, tool_env.clone(), &channel_vars, server)?;
    let stdio = [out_w.as_raw_fd(), err_w.as_raw_fd()];
    // The area's armed spare, or one the call arms itself ([`arm`]: the reaper's part first, so
    // a script process whose reaper refused it is never started, and in strict mode the
    // confinement). A spare that died while it waited refuses a send; the next one is tried,
    // and every spare asked for ahead may have died before the fresh one is.
    let mut attempts_left = SPARES_AHEAD + 1 + usize::from(armed.is_some());
    let mut armed = armed.map(|a| (a, true));
    let (spare, lifeline, status_r) = loop {
        let (mut a, ahead) = match armed.take() {
            // Its reaper died while it waited (its script process may still be exiting, and
            // would take the request): dropped, which kills what is left of it.
            Some((a, _)) if a.is_gone() => {
                attempts_left -= 1;
                continue;
            }
            Some(a) => a,
            None => match arm(
                take_spare(server)?,
                &staging,
                confinement.as_ref(),
                spec.kill_grace,
            ) {
                Ok(a) => (a, false),
                Err(e) => {
                    attempts_left -= 1;
                    if attempts_left == 0 {
                        return Err(ZygoteError::Gone(format!(
                            "its spare refused a request: {e}"
                        )));
                    }
                    continue;
                }
            },
        };
        // A spare preset with other variables than the call's would undo them, which leaves
        // their values in the freed memory of the process that runs this script (the host
        // dropped a passthrough secret meanwhile, say): a fresh spare runs it instead.
        if a.preset_env.as_ref().is_some_and(|preset| *preset != env) {
            drop(a);
            continue;
        }
        let Some(spare) = a.spare.0.take() else {
            continue;
        };
        let took_preset = a.preset.as_ref().is_some_and(|preset| *preset == body);
        let go;
        let message: &[u8] = if took_preset {
            go = go_message(code);
            &go
        } else {
            &body
        };
        match send(&spare.to_script, message, &stdio) {
            Ok(()) => {
                if took_preset {
                    PRESET_TAKEN.fetch_add(1, Ordering::SeqCst);
                }
                if ahead {
                    ARMED_AHEAD.fetch_add(1, Ordering::SeqCst);
                    if a.confined {
                        CONFINED_AHEAD.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let Armed {
                    lifeline, status, ..
                } = a;
                break (spare, lifeline, status);
            }
            Err(e) => {
                spare.kill();
                attempts_left -= 1;
                if attempts_left == 0 {
                    return Err(ZygoteError::Gone(format!(
                        "its spare refused a request: {e}"
                    )));
                }
            }
        }
    };
    if spare.recycled {
        RECYCLED.fetch_add(1, Ordering::SeqCst);
    }
    let Spare { pid, pidfd, .. } = spare;
    // The processes that run this execution hold their descriptors now.
    drop((out_w, err_w, confinement));
    Ok(Launched {
        child: Proc::Forked(Forked {
            pid,
            stdout: Some(std::process::ChildStdout::from(out_r)),
            stderr: Some(std::process::ChildStderr::from(err_r)),
            report: crate::forked::StatusReport::new(std::fs::File::from(status_r)),
        }),
        pidfd: Some(pidfd),
        lifeline,
        staging,
        rpc,
        token,
        env,
        channel_vars,
        tool_env,
        owner,
        // Counts the execution as in flight until it is over (fork_activity::wait_until_idle).
        on_done: Some(Box::new(WhenDone {
            server: Arc::downgrade(server),
            spec: Some(spec.clone()),
            stub,
            _in_flight: crate::fork_activity::InFlight::new(),
        })),
        feeding: None,
    })
}

/// What a forked execution's end does: asks its server for the next spare, and until then
/// counts the execution as in flight (`fork_activity::wait_until_idle`).
///
/// The spare is forked once the execution is over rather than while it runs: a fork of the
/// server and the spare's setup took CPU from the running script on two cores, and a paced call
/// finds the spare ready either way.
#[derive(Debug)]
struct WhenDone {
    server: std::sync::Weak<Server>,
    /// The execution's spec, handed to the preparer when the execution is over.
    spec: Option<LaunchSpec>,
    /// The stub the execution used: the next staging dir is prepared with it.
    stub: Arc<str>,
    _in_flight: crate::fork_activity::InFlight,
}

impl Drop for WhenDone {
    fn drop(&mut self) {
        if let (Some(server), Some(spec)) = (self.server.upgrade(), self.spec.take()) {
            prepare_next(&server, spec, Some(Arc::clone(&self.stub)));
        }
    }
}

/// Sends one message with descriptors on a spare's channel.
fn send(channel: &OwnedFd, body: &[u8], fds: &[RawFd]) -> Result<(), ZygoteError> {
    send_fd(channel.as_raw_fd(), body, fds)
}

/// [`send`] on a channel the caller keeps open.
fn send_fd(channel: RawFd, body: &[u8], fds: &[RawFd]) -> Result<(), ZygoteError> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsg: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(
        channel,
        &[IoSlice::new(body)],
        cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
    .map_err(|e| ZygoteError::Channel(format!("send: {e}")))
}

/// Asks the server for a spare (request `id`).
fn ask(ctl: &OwnedFd, id: u64) -> Result<(), ZygoteError> {
    let body = serde_json::json!({ "id": id }).to_string();
    sendmsg::<()>(
        ctl.as_raw_fd(),
        &[IoSlice::new(body.as_bytes())],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
    .map_err(|e| ZygoteError::Gone(format!("send: {e}")))
}

/// The server's answer to the pending request for a spare (asked now if none is pending),
/// waiting at most [`REPLY_TIMEOUT`]; a spare asked for ahead is usually waiting already.
fn take_spare(server: &Server) -> Result<Spare, ZygoteError> {
    let control = lock(&server.control);
    let Some(ctl) = control.as_ref() else {
        return Err(ZygoteError::Gone("its control channel is closed".into()));
    };
    let mut asked = lock(&server.asked);
    let id = match asked.front() {
        Some(id) => *id,
        None => {
            let id = NEXT_REQUEST.fetch_add(1, Ordering::SeqCst);
            ask(ctl, id)?;
            asked.push_back(id);
            id
        }
    };
    take_reply(ctl, &mut asked, id, Instant::now() + REPLY_TIMEOUT)
}

/// The spare the reply to request `id` (the oldest of `asked`) hands over.
fn take_reply(
    ctl: &OwnedFd,
    asked: &mut std::collections::VecDeque<u64>,
    id: u64,
    deadline: Instant,
) -> Result<Spare, ZygoteError> {
    // Replies carry the request's id: one meant for no request of ours (a forked process that
    // still held the channel could have written it) is dropped, never taken as ours.
    loop {
        let (text, fds) = receive(ctl, deadline)?;
        let value: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| ZygoteError::Channel(format!("bad reply: {e}")))?;
        if value.get("id").and_then(|i| i.as_u64()) != Some(id) {
            continue;
        }
        asked.pop_front();
        if let Some(e) = value.get("error").and_then(|e| e.as_str()) {
            return Err(ZygoteError::Refused(e.to_string()));
        }
        let pid = value
            .get("pid")
            .and_then(|p| p.as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| ZygoteError::Channel("reply without a pid".into()))?;
        let Ok::<[OwnedFd; 3], _>([pidfd, to_reaper, to_script]) = fds.try_into() else {
            return Err(ZygoteError::Channel(
                "a spare came without its pidfd and channels".into(),
            ));
        };
        return Ok(Spare {
            pid,
            pidfd,
            to_reaper,
            to_script,
            recycled: value.get("recycled").and_then(|r| r.as_bool()) == Some(true),
        });
    }
}

/// A spare asked for ahead whose reply comes within `wait`, for arming a prepared area. The
/// reply is waited for without holding the control channel, so a call that needs a spare
/// meanwhile takes the first one; `None` if none was asked for or came, or the server is gone.
/// `watched` is a copy of the control channel, polled without its lock.
fn spare_when_ready(server: &Server, watched: &OwnedFd, wait: Duration) -> Option<Spare> {
    let deadline = Instant::now() + wait;
    loop {
        if lock(&server.asked).is_empty()
            || !poll_in(
                watched.as_raw_fd(),
                deadline.saturating_duration_since(Instant::now()),
            )
        {
            return None;
        }
        let control = lock(&server.control);
        let ctl = control.as_ref()?;
        let mut asked = lock(&server.asked);
        let id = *asked.front()?;
        if !poll_in(ctl.as_raw_fd(), Duration::ZERO) {
            // A call took it first.
            continue;
        }
        return take_reply(ctl, &mut asked, id, Instant::now() + REPLY_TIMEOUT)
            .map_err(|e| tracing::debug!("execute_code: a spare for arming ahead: {e}"))
            .ok();
    }
}

/// Asks for spares until [`SPARES_AHEAD`] are asked for; the server forks them and their
/// answers wait on the channel until calls take them. A failure here is reported by that call.
fn ask_ahead(server: &Server) {
    // An armed spare that died while it waited is let go here, so that its area is armed
    // again and a spare is asked for in its place.
    let armed = {
        let mut ready = lock(&server.ready);
        for p in ready.iter_mut() {
            if p.armed.as_ref().is_some_and(Armed::is_gone) {
                p.armed = None;
            }
        }
        ready.iter().filter(|p| p.armed.is_some()).count()
    };
    let control = lock(&server.control);
    let Some(ctl) = control.as_ref() else { return };
    let mut asked = lock(&server.asked);
    // A prepared area's armed spare counts as ahead: calls take those first.
    while asked.len() + armed < SPARES_AHEAD {
        let id = NEXT_REQUEST.fetch_add(1, Ordering::SeqCst);
        if ask(ctl, id).is_err() {
            return;
        }
        asked.push_back(id);
    }
}

/// One reply from the server (its text and the descriptors it carried), waiting until
/// `deadline`.
fn receive(ctl: &OwnedFd, deadline: Instant) -> Result<(Vec<u8>, Vec<OwnedFd>), ZygoteError> {
    if !poll_in(
        ctl.as_raw_fd(),
        deadline.saturating_duration_since(Instant::now()),
    ) {
        return Err(ZygoteError::Gone("no reply to a fork request".into()));
    }
    let mut buf = vec![0u8; 4096];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        ctl.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| ZygoteError::Gone(format!("recv: {e}")))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| ZygoteError::Channel(format!("recv: {e}")))?
    {
        if let ControlMessageOwned::ScmRights(got) = c {
            for fd in got {
                // SAFETY: SCM_RIGHTS delivered a new descriptor that nobody else owns.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let len = msg.bytes;
    if len == 0 {
        return Err(ZygoteError::Gone("it closed its control channel".into()));
    }
    Ok((buf[..len].to_vec(), fds))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, val)| (k.into(), val.into())).collect()
    }

    #[test]
    fn only_empty_dirs_of_servers_whose_supervisor_is_gone_are_removed() {
        let parent = tempfile::tempdir().unwrap();
        let mut done = std::process::Command::new("true").spawn().unwrap();
        let dead = done.id();
        done.wait().unwrap();
        let dir = |name: String| {
            let p = parent.path().join(name);
            std::fs::create_dir(&p).unwrap();
            p
        };
        let stale = dir(format!("{SERVER_DIR_PREFIX}{dead}-a1"));
        let holding = dir(format!("{SERVER_DIR_PREFIX}{dead}-b2"));
        std::fs::write(holding.join("f"), "x").unwrap();
        let ours = dir(format!("{SERVER_DIR_PREFIX}{}-c3", std::process::id()));
        let init = dir(format!("{SERVER_DIR_PREFIX}1-d4"));
        let unnamed = dir(format!("{SERVER_DIR_PREFIX}x-e5"));
        let other = dir(format!("vibeos-exec-{dead}-f6"));
        remove_dead_servers_dirs(parent.path());
        assert!(!stale.exists());
        for kept in [holding, ours, init, unnamed, other] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn a_request_is_its_fields_between_nuls_and_refuses_a_nul_in_one() {
        let p = std::path::Path::new;
        let body = script_request(
            p("/work dir"),
            p("/s"),
            p("/s/script.py"),
            &[["A", "1"], ["EMPTY", ""]],
            &["GONE"],
        )
        .unwrap();
        assert_eq!(
            body,
            b"/work dir\x00/s\x00/s/script.py\x002\x00A\x001\x00EMPTY\x00\x00GONE".to_vec()
        );
        let body = script_request(p("/"), p("/s"), p("/s/x"), &[], &[]).unwrap();
        assert_eq!(body, b"/\x00/s\x00/s/x\x000".to_vec());
        assert!(script_request(p("/"), p("/s"), p("/s/x"), &[["A", "b\0c"]], &[]).is_err());
    }

    #[test]
    fn the_environment_delta_sets_what_differs_and_removes_what_is_gone() {
        let process: HashMap<OsString, OsString> =
            pairs(&[("KEEP", "same"), ("CHANGE", "old"), ("GONE", "x")])
                .into_iter()
                .collect();
        // A name given twice takes its last value; unchanged names are not sent.
        let env = pairs(&[
            ("NEW", "1"),
            ("KEEP", "same"),
            ("CHANGE", "first"),
            ("CHANGE", "new"),
            ("TWICE", "a"),
            ("TWICE", "b"),
        ]);
        let (set, unset) = env_delta(&env, &process).unwrap();
        assert_eq!(set, vec![["NEW", "1"], ["CHANGE", "new"], ["TWICE", "b"]]);
        assert_eq!(unset, vec!["GONE"]);
        // The last value equal to the server's: nothing to send for that name.
        let env = pairs(&[("KEEP", "other"), ("KEEP", "same"), ("CHANGE", "old")]);
        let (set, unset) = env_delta(&env, &process).unwrap();
        assert!(set.is_empty(), "{set:?}");
        assert_eq!(unset, vec!["GONE"]);
    }
}
