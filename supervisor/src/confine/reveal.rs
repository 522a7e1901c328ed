//! Making an interpreter (or staging dir) under a closed directory reachable without any
//! capability (SPEC §6: "no capabilities").
//!
//! A pyenv install in root's home (`/root` is 0700) cannot be reached by the script's
//! unprivileged uid. The script used to keep `CAP_DAC_READ_SEARCH` for that, and that one
//! capability let it stat, readlink, access, chdir into and read xattrs of anything under a
//! closed directory — the path-based calls landlock does not mediate. Instead, the script
//! process now gets a private mount namespace (set up while it is still root, before the uid
//! drop) in which each closed ancestor is covered by a small empty tmpfs (mode 0711) holding
//! just the directory chain down to the needed path, with the real directory bind-mounted at
//! its own path. Paths stay the same (an interpreter's absolute RUNPATH keeps working), the
//! rest of the closed directory is simply not there, and landlock rules — which are attached
//! to inodes — still apply through the bind.
//!
//! Everything is prepared in the parent as C strings. The child, once in its namespace, takes a
//! detached copy of each needed directory with `open_tree(OPEN_TREE_CLONE)` *before* the tmpfs
//! hides it, and attaches it afterwards with `move_mount` (a bind from a descriptor opened
//! before `unshare` would belong to the other namespace, which the kernel refuses). The child
//! only makes raw system calls.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// One closed directory covered by a tmpfs, and what to show in it.
#[derive(Debug)]
struct Cover {
    target: CString,
    /// Directories to create inside the tmpfs, parents first.
    mkdirs: Vec<CString>,
    /// Directories to show at their own path.
    binds: Vec<CString>,
}

/// Most directories one plan may reveal (the child keeps their trees in a fixed array).
const MAX_BINDS: usize = 16;

/// The mount-namespace plan of one script process.
#[derive(Debug)]
pub struct Reveal {
    covers: Vec<Cover>,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{} contains a NUL byte", p.display())))
}

impl Reveal {
    /// A plan that makes every path of `needed` reachable, given `closed(path)` that names the
    /// first ancestor the script's uid cannot search. `None` when nothing is closed.
    pub fn plan(
        needed: &[PathBuf],
        closed: impl Fn(&Path) -> Option<PathBuf>,
    ) -> io::Result<Option<Reveal>> {
        let mut pairs: Vec<(PathBuf, PathBuf)> = Vec::new();
        for n in needed {
            if let Some(a) = closed(n) {
                // The needed path itself closed: nothing to cover it with but itself. And `/`
                // cannot be covered without hiding everything else.
                if &a == n || a == Path::new("/") {
                    return Err(io::Error::other(format!(
                        "{} itself is closed to the script's uid",
                        n.display()
                    )));
                }
                pairs.push((a, n.clone()));
            }
        }
        if pairs.is_empty() {
            return Ok(None);
        }
        // One cover per outermost closed dir; a closed dir inside another cover is recreated.
        let mut targets: Vec<PathBuf> = pairs.iter().map(|(a, _)| a.clone()).collect();
        targets.sort();
        targets.dedup();
        let outer: Vec<PathBuf> = targets
            .iter()
            .filter(|t| !targets.iter().any(|o| o != *t && t.starts_with(o)))
            .cloned()
            .collect();
        let mut covers = Vec::new();
        for target in outer {
            let mut mkdirs = Vec::new();
            let mut binds = Vec::new();
            for (_, n) in pairs.iter().filter(|(_, n)| n.starts_with(&target)) {
                let mut p = target.clone();
                if let Ok(rel) = n.strip_prefix(&target) {
                    for c in rel.components() {
                        p.push(c);
                        let c = cstr(&p)?;
                        if !mkdirs.contains(&c) {
                            mkdirs.push(c);
                        }
                    }
                }
                binds.push(cstr(n)?);
            }
            covers.push(Cover {
                target: cstr(&target)?,
                mkdirs,
                binds,
            });
        }
        if covers.iter().map(|c| c.binds.len()).sum::<usize>() > MAX_BINDS {
            return Err(io::Error::other("too many closed directories to reveal"));
        }
        Ok(Some(Reveal { covers }))
    }

    /// Each cover as (closed dir, dirs to create in its tmpfs, paths to bind back), for a
    /// process that applies the same steps itself (the fork server's children, which run
    /// Python, not this code).
    pub fn steps(&self) -> Vec<(String, Vec<String>, Vec<String>)> {
        let text = |c: &CString| c.to_string_lossy().into_owned();
        self.covers
            .iter()
            .map(|c| {
                (
                    text(&c.target),
                    c.mkdirs.iter().map(text).collect(),
                    c.binds.iter().map(text).collect(),
                )
            })
            .collect()
    }

    /// The covered directories, for logs.
    pub fn covered(&self) -> Vec<String> {
        self.covers
            .iter()
            .map(|c| c.target.to_string_lossy().into_owned())
            .collect()
    }

    /// Enters a private mount namespace and sets the covers up.
    ///
    /// # Safety
    /// Only between fork and exec in the script process, while it is still root.
    pub unsafe fn apply(&self) -> io::Result<()> {
        fn check(rc: libc::c_int) -> io::Result<()> {
            if rc != 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        // SAFETY: raw system calls on C strings prepared before the fork.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing done here may propagate back to the host's mounts.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // Detached copies of what must stay visible, taken before anything is covered.
            let mut trees: [libc::c_int; MAX_BINDS] = [-1; MAX_BINDS];
            let mut n = 0;
            for cover in &self.covers {
                for dir in &cover.binds {
                    let fd = libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        dir.as_ptr(),
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
                    );
                    if fd < 0 || n >= MAX_BINDS {
                        return Err(io::Error::last_os_error());
                    }
                    trees[n] = fd as libc::c_int;
                    n += 1;
                }
            }
            let mut i = 0;
            for cover in &self.covers {
                check(libc::mount(
                    c"vibeos-cover".as_ptr(),
                    cover.target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0711,size=64k,nr_inodes=256".as_ptr().cast(),
                ))?;
                for dir in &cover.mkdirs {
                    let rc = libc::mkdir(dir.as_ptr(), 0o711);
                    if rc != 0 && *libc::__errno_location() != libc::EEXIST {
                        return Err(io::Error::last_os_error());
                    }
                    // The caller's umask (077) would leave it 0700: the script's uid could not
                    // pass through to what is bound below it.
                    check(libc::chmod(dir.as_ptr(), 0o711))?;
                }
                for dir in &cover.binds {
                    let rc = libc::syscall(
                        libc::SYS_move_mount,
                        trees[i],
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        dir.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    );
                    if rc != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(trees[i]);
                    i += 1;
                }
                // The cover itself: no more entries can appear in it.
                check(libc::mount(
                    std::ptr::null(),
                    cover.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    c"mode=0711".as_ptr().cast(),
                ))?;
            }
        }
        Ok(())
    }
}

/// A mount namespace set up as [`Reveal::apply`] sets one up, kept as a descriptor so that many
/// script processes can start from it (`setns`) instead of building the same covers each.
///
/// Made by a child forked for the purpose: it applies the plan, reports, and waits until this
/// process has opened its namespace (`/proc/PID/ns/mnt`), then exits. The namespace lives on as
/// long as a descriptor of it is open. A process that enters it must `unshare(CLONE_NEWNS)` at
/// once, so that what it mounts (its staging dir's disk budget) stays its own; entering it is
/// root's alone (`CAP_SYS_ADMIN`), and it holds nothing but the covers and the host's mounts as
/// they were when it was made.
fn make_template(plan: &Reveal) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = crate::fds::cloexec_pipe()?;
    let (hold_r, hold_w) = crate::fds::cloexec_pipe()?;
    let (ready_w_raw, hold_r_raw) = (ready_w.as_raw_fd(), hold_r.as_raw_fd());
    // SAFETY: the child of a multi-threaded process runs only async-signal-safe system calls
    // (close_range, the raw calls of `apply` on C strings made before the fork, write, read,
    // _exit) and never returns into Rust code of the parent's.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; this branch ends in _exit.
        unsafe {
            // Nothing of the host's stays open in the namespace's maker (another execution's
            // lifeline here would delay its EOF).
            crate::fds::close_all_except(ready_w_raw, hold_r_raw);
            let done: u8 = u8::from(plan.apply().is_ok());
            libc::write(ready_w_raw, (&done as *const u8).cast(), 1);
            let mut byte = 0u8;
            libc::read(hold_r_raw, (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(hold_r);
    let mut ready = std::fs::File::from(ready_r);
    let mut done = [0u8; 1];
    let made = std::io::Read::read(&mut ready, &mut done);
    let opened = match made {
        Ok(1) if done[0] == 1 => {
            std::fs::File::open(format!("/proc/{pid}/ns/mnt")).map(OwnedFd::from)
        }
        Ok(_) => Err(io::Error::other(
            "the namespace's maker could not apply the covers",
        )),
        Err(e) => Err(e),
    };
    drop(hold_w);
    let mut status = 0;
    // SAFETY: waits for our own child, which exits once `hold_w` is closed.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    opened
}

/// Templates made so far: each plan's steps, what its bound directories were (device and inode)
/// when it was made, and the namespace.
type Templates = Vec<(
    Vec<(String, Vec<String>, Vec<String>)>,
    Vec<(u64, u64)>,
    Arc<OwnedFd>,
)>;

static TEMPLATES: Mutex<Templates> = Mutex::new(Vec::new());
static TEMPLATES_MADE: AtomicU64 = AtomicU64::new(0);

/// Most templates kept at once (one per interpreter location in practice).
const TEMPLATES_KEPT: usize = 8;

/// The device and inode of each directory `plan` binds back, in order; `None` if one is gone.
fn bound_identity(plan: &Reveal) -> Option<Vec<(u64, u64)>> {
    plan.covers
        .iter()
        .flat_map(|c| &c.binds)
        .map(|dir| {
            let meta = std::fs::metadata(std::ffi::OsStr::from_bytes(dir.as_bytes())).ok()?;
            Some((meta.dev(), meta.ino()))
        })
        .collect()
}

/// A mount namespace with `plan`'s covers for processes that enter it and then unshare their
/// own copy (the fork server's strict spares), made once per plan and kept for the process's
/// life; `None` when the plan reveals a path under `staging` (a plan of one execution only)
/// or the namespace cannot be made, and the caller applies the plan itself. A plan whose bound
/// directories were replaced since (an interpreter reinstalled) gets a new one.
pub fn template_for(plan: &Reveal, staging: &Path) -> Option<Arc<OwnedFd>> {
    let steps = plan.steps();
    let staging = staging.to_string_lossy();
    let mentions_staging = |p: &String| Path::new(p).starts_with(staging.as_ref());
    if steps
        .iter()
        .any(|(t, m, b)| mentions_staging(t) || m.iter().chain(b).any(mentions_staging))
    {
        return None;
    }
    let identity = bound_identity(plan)?;
    let mut templates = TEMPLATES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = templates.iter().position(|(s, _, _)| *s == steps) {
        if templates[at].1 == identity {
            return Some(Arc::clone(&templates[at].2));
        }
        templates.remove(at);
    }
    match make_template(plan) {
        Ok(ns) => {
            TEMPLATES_MADE.fetch_add(1, Ordering::Relaxed);
            let ns = Arc::new(ns);
            if templates.len() >= TEMPLATES_KEPT {
                templates.remove(0);
            }
            templates.push((steps, identity, Arc::clone(&ns)));
            Some(ns)
        }
        Err(e) => {
            tracing::warn!(
                "execute_code: strict spares build their mount namespaces one by one: cannot \
                 make a shared template of the covers: {e}"
            );
            None
        }
    }
}

/// Closes every template this process keeps (a host that turns its fork servers off); the
/// namespaces go once no spare still holds a descriptor of one.
pub fn drop_templates() {
    TEMPLATES.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// How many mount namespace templates this process has made ([`template_for`]).
pub fn templates_made() -> u64 {
    TEMPLATES_MADE.load(Ordering::Relaxed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn one_cover_per_outermost_closed_dir_with_the_chain_to_each_needed_path() {
        let d = tempfile::tempdir().unwrap();
        let closed = d.path().join("home");
        let py = closed.join(".pyenv/versions/3.11");
        let tmp = closed.join("tmp/staging");
        std::fs::create_dir_all(&py).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        let open = d.path().join("open");
        std::fs::create_dir_all(&open).unwrap();
        let c = closed.clone();
        let plan = Reveal::plan(&[py.clone(), tmp.clone(), open.clone()], |p| {
            p.starts_with(&c).then(|| c.clone())
        })
        .unwrap()
        .unwrap();
        assert_eq!(plan.covered(), vec![closed.display().to_string()]);
        let cover = &plan.covers[0];
        let dirs: Vec<String> = cover
            .mkdirs
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        for want in [&closed.join(".pyenv"), &py, &closed.join("tmp"), &tmp] {
            assert!(
                dirs.contains(&want.display().to_string()),
                "{want:?} in {dirs:?}"
            );
        }
        assert_eq!(cover.binds.len(), 2);

        assert!(Reveal::plan(std::slice::from_ref(&open), |_| None)
            .unwrap()
            .is_none());
        assert!(Reveal::plan(std::slice::from_ref(&py), |_| Some(PathBuf::from("/"))).is_err());
        assert!(Reveal::plan(std::slice::from_ref(&py), |p| Some(p.to_path_buf())).is_err());
    }
}
