import sys
# The fork server of one launch key (supervisor/src/zygote.rs, docs/warm-pool.md). It imports
# what the stub imports, then forks one spare execution (a reaper and its script process) per
# request of its supervisor, hands the spare's channels to the supervisor, and never sees an
# execution's request or runs any script code itself. argv: -c BOOT CONTROL_FD EMPTY_DIR
# RUNTIME (the source of the stub's fixed part, vibeos_rpc::RUNTIME_SOURCE).
_fresh_names = set(globals())
_control_fd, _empty, _runtime_source = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# Import only from the interpreter's own library: neither the cwd nor a PYTHONPATH entry (the
# project dir in project mode) may contribute a module, so no user code ever runs here.
_saved_path = list(sys.path)
_own = [p for p in sys.path if p and p.startswith((sys.prefix, sys.base_prefix, sys.exec_prefix))]
sys.path[:] = _own

import json, os, socket, threading, time  # noqa: E401,F401  (the stub's imports)
import atexit, gc, types, signal, select, resource, errno, array, ctypes  # noqa: E401
import importlib.machinery
import _signal

# The stub's fixed part, run once here instead of compiled by every forked script that imports
# its tools (about 1.2 ms of a 1.45 ms compile; docs/warm-pool.md). It is kept out of
# sys.modules: a forked script's first import of it gets it through _PreloadedRuntime, which
# first gives its code the file name of the execution's copy. It reads nothing of the
# environment before its first call, so no execution's settings are in it.
_RUNTIME_NAME = "_vibeos_runtime"
_runtime = types.ModuleType(_RUNTIME_NAME)
_runtime.__file__ = "<vibeos runtime>"
exec(compile(_runtime_source, _runtime.__file__, "exec"), _runtime.__dict__)
del _runtime_source

sys.path[:] = _saved_path
del _saved_path, _own

# The interpreter was started with -S: `site` runs here, after the imports above, and without
# `sitecustomize` and `usercustomize`, which every child runs itself once it is confined and
# has its execution's environment (`_customize`), as a cold start runs them. The site dirs'
# `.pth` files run here; a strict server starts only where a strict script cannot have written
# them (startup_files.rs). PYTHONPATH is not in a strict server's environment at all: its
# entries are put back in each child (`_with_pythonpath`).
import site  # noqa: E402


def _site_without_customize():
    customize = site.execsitecustomize, site.execusercustomize
    site.execsitecustomize = site.execusercustomize = lambda: None
    # `-c` put '' (the cwd) first; at a normal start `site` runs before that, so it must not
    # see it: it would make it absolute and drop the PYTHONPATH entry equal to it, and a forked
    # script's sys.path would differ from a cold one's.
    first = sys.path.pop(0) if sys.path and sys.path[0] == "" else None
    try:
        site.main()
    finally:
        site.execsitecustomize, site.execusercustomize = customize
        if first is not None:
            sys.path.insert(0, first)


_site_without_customize()
_pythonpath_at_start = "PYTHONPATH" in os.environ


def _with_pythonpath(path, staging, pythonpath):
    """`path` (the server's sys.path, the script's dir first) as a cold start with `pythonpath`
    would have it: its entries, absolute, after the script's dir, duplicates of later entries
    dropped as `site` drops them."""
    entries = [os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]
    merged, seen = [], set()
    for p in entries + path[1:]:
        if p not in seen:
            seen.add(p)
            merged.append(p)
    return [staging] + merged


def _customize():
    """What `site` does last at a cold start, done in the child as its own: each module is
    looked up unless its plan (`_plan_customize`) shows that the lookup would find nothing."""
    plan = _customize_plan if _customize_plan is not None else _plan_customize()
    mtimes = {}
    if not _unchanged(plan.get("sitecustomize"), mtimes):
        site.execsitecustomize()
    if site.ENABLE_USER_SITE and not _unchanged(plan.get("usercustomize"), mtimes):
        site.execusercustomize()

# A cold start looks `sitecustomize` and `usercustomize` up on every sys.path entry and almost
# always finds neither; in a forked child that failed import costs a quarter of a millisecond
# (the import system's Python, and the pages it writes). The server looks them up once, here,
# on its own entries; a child then skips a lookup that would fail the same way
# (`_plan_customize`). A FileFinder answers from the listing it made at the mtime it holds, so the
# dirs whose mtime is unchanged answer as they did here: name -> {entry: mtime}.
_customize_absent = {}
# The meta path finders that did not find either module here (the child's must be the same).
_meta_at_boot = []
# The execution's staging dir, in its script process.
_staging = None


def _note_customize_absent():
    global _meta_at_boot
    finders = [f for f in sys.meta_path if f is not importlib.machinery.PathFinder]
    for name in ("sitecustomize", "usercustomize"):
        try:
            if name in sys.modules or any(f.find_spec(name, None) is not None for f in finders):
                continue
        except Exception:
            continue
        absent = {}
        for entry in sys.path:
            if not isinstance(entry, str) or entry in ("", _empty):
                continue
            try:
                before = os.stat(entry).st_mtime
                found = importlib.machinery.PathFinder.find_spec(name, [entry])
                after = os.stat(entry).st_mtime
            except (OSError, ImportError, ValueError):
                continue
            finder = sys.path_importer_cache.get(entry)
            if found is None and before == after and type(finder) is importlib.machinery.FileFinder:
                absent[entry] = after
        _customize_absent[name] = absent
    _meta_at_boot = finders


def _skipped(entry):
    """Whether the child's import looks nowhere in `entry`: its staging dir (it holds only what
    the supervisor wrote there), or an entry the import system skips (no finder)."""
    return entry == _staging or (entry in sys.path_importer_cache
                                 and sys.path_importer_cache[entry] is None)


# What `_customize` checks for this execution (`_plan_customize`), made when its request is
# settled.
_customize_plan = None


def _plan_customize():
    """For `sitecustomize` and `usercustomize`, the sys.path entries with the mtime each had
    when the server listed it without the module (`_note_customize_absent`): a FileFinder
    answers from the listing it made at the mtime it holds, so if every entry still has that
    mtime, the child's import of the module would find nothing, and `_customize` skips it. A
    module has no plan when nothing settles that (the meta path changed, the module is loaded,
    an entry was never listed): it is looked up. Made once the request's sys.path is set,
    which stays as it is until the script runs: a preset spare makes it while it waits, and
    the call then only takes a stat per entry."""
    plan = {}
    try:
        if _meta_path_changed():
            return plan
        for name in ("sitecustomize", "usercustomize"):
            absent = _customize_absent.get(name)
            if absent is None or name in sys.modules:
                continue
            checks = []
            for entry in sys.path:
                if _skipped(entry):
                    continue
                noted = absent.get(entry)
                if noted is None:
                    break
                checks.append((entry, noted))
            else:
                plan[name] = checks
    except Exception:
        return {}
    return plan


def _unchanged(checks, mtimes):
    """Whether every entry of a module's plan still has the mtime it lists (False for no
    plan). `mtimes` keeps the mtimes taken so far, so an entry of both plans is stat'ed once."""
    if checks is None:
        return False
    for entry, noted in checks:
        if entry not in mtimes:
            try:
                mtimes[entry] = os.stat(entry).st_mtime
            except OSError:
                mtimes[entry] = None
        if mtimes[entry] != noted:
            return False
    return True


def _meta_path_changed():
    """Whether the meta path differs from the server's, which may then answer anything."""
    meta = [f for f in sys.meta_path if f is not importlib.machinery.PathFinder
            and not isinstance(f, _PreloadedRuntime)]
    return len(meta) != len(_meta_at_boot) or any(a is not b for a, b in zip(meta, _meta_at_boot))

_libc = ctypes.CDLL(None, use_errno=True)
# Every libc function a child calls is looked up here, before any fork: a CDLL resolves a name
# at its first use and caches the function object on itself, and in a forked child that first
# use (the symbol lookup, the object, the argument types) cost a strict spare about 0.17 ms of
# copied pages and work on every execution.
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 1, 38, 36
_WATCHED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_ctl = socket.socket(fileno=_control_fd)
# The supervisor that started this server (the one whose staging dirs its reapers may sweep).
_supervisor = os.getppid()


def _start_policy():
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return None


# The scheduling policy the host started this server with: what a script process gets back
# (`_foreground`), as a cold start would inherit it. Only the default policy is ever lowered.
_HOST_POLICY = _start_policy()


# The policy this process last set (a fork inherits it with the process's own): a change to
# the same policy is skipped, not a system call on the call's path.
_policy_now = _HOST_POLICY


def _set_policy(policy):
    global _policy_now
    if _HOST_POLICY != os.SCHED_OTHER or policy == _policy_now:
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
        _policy_now = policy
    except OSError:
        pass


def _background():
    """From here this process works for a call yet to come, or has done its part of the one
    under way: SCHED_BATCH, whose wake-ups never preempt a running process. At the default
    policy, the server's fork of the next spare, a reaper's next script process and a killed
    script's teardown took the CPU from the host returning the call's result (docs/warm-pool.md,
    "Background work off the call's path"). The nice value stays, so `_foreground` needs no
    privilege, whatever uid the process has by then."""
    _set_policy(getattr(os, "SCHED_BATCH", os.SCHED_OTHER))


def _foreground():
    """Back to the host's policy, as soon as this process serves a call."""
    _set_policy(os.SCHED_OTHER)


def _reap_all(*_):
    while True:
        try:
            pid, _st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reaped.append(pid)


# Reapers this server forked and has not reaped yet: pid -> a pidfd opened while the pid could
# not be reused. Kept for the reaper's life, since a recycled reaper is handed out again.
_pidfds = {}
# Pids reaped by the SIGCHLD handler whose pidfds the loop has not closed yet.
_reaped = []
# Spares that reapers handed back after an execution (`_hand_back`): (pid, to_reaper, to_script).
_returned = []
# How many handed-back spares wait here at most; one more is let go (it exits at EOF).
_KEEP_RETURNED = 2
# What the server tells a reaper whose spare it keeps.
_KEEP = b"keep"
# The channel reapers hand their next spare back on: the server reads `_returns`, every reaper
# holds `_returns_w`, and a script process closes it before anything else.
_returns, _returns_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


# `struct sock_filter` is 8 bytes: u16 code, u8 jt, u8 jf, u32 k.
_SOCK_FILTER_SIZE = 8


class _SockFprog(ctypes.Structure):
    """`struct sock_fprog`. The filter points into the bytes the program came in (a `c_char_p`
    field keeps them alive and copies nothing): an array type per program length, made in the
    child, cost a strict spare about 0.2 ms per execution."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _check(rc, what):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _children(pid, tids=None):
    """The children of every thread of `pid` (of the threads `tids`, when the caller knows
    them). Read with os-level calls: a file object costs four more system calls per file, on
    the path of every claim (`_take_claim`)."""
    out = []
    if tids is None:
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            return out
    for tid in tids:
        try:
            fd = os.open("/proc/%d/task/%s/children" % (pid, tid), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            text = b""
            while True:
                chunk = os.read(fd, 4096)
                text += chunk
                # A seq_file read fills the buffer unless the list ends first: a short read
                # is the whole of it, and the read that would return nothing is not needed.
                if len(chunk) < 4096:
                    break
            out.extend(int(x) for x in text.split())
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)
    return out


def _signal_tree(root, sig):
    # As the Rust reaper does (reaper.rs): depth first, stopping each process before looking at
    # its children so it cannot fork meanwhile.
    stack, seen = _children(root), 0
    while stack and seen < 1000000:
        pid = stack.pop()
        try:
            if sig == signal.SIGKILL:
                os.kill(pid, signal.SIGSTOP)
            stack.extend(_children(pid))
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
        seen += 1


def _kill_everything_below():
    me = os.getpid()
    while True:
        _signal_tree(me, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _exiting(pid):
    """Whether `pid` is exiting or gone: PF_EXITING in its /proc stat flags (the ninth field)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return True
    fields = stat[stat.rfind(b")") + 1:].split()
    try:
        return int(fields[6]) & 0x4 != 0
    except (IndexError, ValueError):
        return False


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                   ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]
# The status a forked script claims it is about to exit with (`_announce_exit`), -1 for none.
# Made before any fork, so it is at the same address in the reaper and the script process.
_claim = ctypes.c_int(-1)


class _ClaimReader:
    """Reads a stopped script's claim (`_announce_exit`) out of its memory. Made, and run once,
    while the spare waits for its request: in a forked reaper the first run of any code copies
    the pages it touches, which cost a claim most of half a millisecond on the call's path."""

    def __init__(self, script):
        self.script = script
        self.value = ctypes.c_int(-1)
        self.local = _IOVec(ctypes.addressof(self.value), ctypes.sizeof(self.value))
        self.remote = _IOVec(ctypes.addressof(_claim), ctypes.sizeof(_claim))
        # The reaper runs one thread (a fork keeps only the forking one, and it starts none).
        self.me = os.getpid()
        # The files a claim reads, opened here and read again from their start at the claim:
        # three system calls on its path instead of seven, and no path looked up in /proc.
        # Each names its process, not a pid that could be reused: the script is not waited
        # for before its claim is taken or declined.
        self.fds = []
        self.mine = self._open("/proc/%d/task/%d/children" % (self.me, self.me))
        self.theirs = self._open("/proc/%d/task/%d/children" % (script, script))
        self.tasks = self._open("/proc/%d/task" % script)
        self.only_script = b"%d " % script
        self.read()
        self.alone()

    def _open(self, path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        self.fds.append(fd)
        return fd

    def close(self):
        for fd in self.fds:
            os.close(fd)
        del self.fds[:]

    def alone(self):
        """Whether the stopped script is this reaper's only child and has no child itself.
        A `children` file (seq_file) lists each pid followed by a space; a task dir's link
        count is two plus its thread count."""
        if -1 in (self.mine, self.theirs, self.tasks):
            return _children(self.me, (self.me,)) == [self.script] and not _children(self.script)
        try:
            if os.pread(self.mine, 4096, 0) != self.only_script:
                return False
            if os.fstat(self.tasks).st_nlink == 3:
                return os.pread(self.theirs, 4096, 0) == b""
        except OSError:
            return False
        return not _children(self.script)

    def read(self):
        """The claimed status, -1 for none, None if it cannot be read."""
        self.value.value = -1
        n = _libc.process_vm_readv(self.script, ctypes.byref(self.local), 1,
                                   ctypes.byref(self.remote), 1, 0)
        return self.value.value if n == ctypes.sizeof(self.value) else None


def _take_claim(reader):
    """The exit status the script claimed, if it has stopped with a claim and is the only
    process below this reaper; it is then killed (nothing of it could run again once stopped).
    A stopped script whose claim cannot be read is continued, so it exits as always; one that
    claimed nothing (a script may stop itself) is left as it is. Only a stop is looked at: an
    exit stays for the main wait."""
    script = reader.script
    try:
        stopped = os.waitid(os.P_PID, script, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return None
    if stopped is None:
        return None
    value = reader.read()
    if value == -1:
        return None
    # The script is stopped, every thread of it: none can start a thread or a process while
    # these are read.
    if value is None or not 0 <= value <= 255 or not reader.alone():
        os.kill(script, signal.SIGCONT)
        return None
    os.kill(script, signal.SIGKILL)
    return value


def _sweep(path):
    # The supervisor died before removing the staging dir: do what its reaper would.
    try:
        _libc.umount2(path.encode(), 2 | 8)  # MNT_DETACH | UMOUNT_NOFOLLOW
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        os.rmdir(os.path.dirname(path))
    except Exception:
        pass


_AT_FDCWD, _CLONE_NEWNS = -100, 0x00020000


def _detached_copy(path, nr, recursive):
    """open_tree(OPEN_TREE_CLONE): a detached copy of the mount at `path` (and of those below
    it when `recursive`), close-on-exec, to attach elsewhere with `_attach`."""
    flags = 1 | 0o2000000 | (0x8000 if recursive else 0)  # CLONE | O_CLOEXEC | AT_RECURSIVE
    fd = _libc.syscall(ctypes.c_long(nr["open_tree"]), ctypes.c_int(_AT_FDCWD),
                       ctypes.c_char_p(path.encode()), ctypes.c_uint(flags))
    _check(fd, "open_tree " + path)
    return fd


def _attach(tree, path, nr):
    """move_mount(MOVE_MOUNT_F_EMPTY_PATH): attaches a detached copy at `path`."""
    _check(_libc.syscall(ctypes.c_long(nr["move_mount"]), ctypes.c_int(tree),
                         ctypes.c_char_p(b""), ctypes.c_int(_AT_FDCWD),
                         ctypes.c_char_p(path.encode()), ctypes.c_uint(4)),
           "move_mount " + path)


def _reveal(covers, nr):
    """confine/reveal.rs: a private mount namespace in which each closed directory is covered
    by a read-only tmpfs holding only the paths the script needs, bound back."""
    ms_nosuid, ms_nodev, ms_noexec, ms_remount, ms_rdonly = 2, 4, 8, 32, 1
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, 16384 | 262144, None), "making / private")
    trees = [_detached_copy(d, nr, True) for _target, _mkdirs, binds in covers for d in binds]
    i = 0
    for target, mkdirs, binds in covers:
        _check(_libc.mount(b"vibeos-cover", target.encode(), b"tmpfs",
                           ms_nosuid | ms_nodev | ms_noexec, b"mode=0711,size=64k,nr_inodes=256"),
               "covering " + target)
        for d in mkdirs:
            try:
                os.mkdir(d, 0o711)
            except FileExistsError:
                pass
            os.chmod(d, 0o711)  # not what the host's umask (077) leaves: the uid must pass
        for d in binds:
            _attach(trees[i], d, nr)
            os.close(trees[i])
            i += 1
        _check(_libc.mount(None, target.encode(), None,
                           ms_remount | ms_rdonly | ms_nosuid | ms_nodev | ms_noexec, b"mode=0711"),
               "remounting " + target)


def _enter_template(template, staging, nr):
    """The mount namespace step from a template of the reveal plan (confine/reveal.rs
    `template_for`: the covers already set up): a detached copy of the staging dir's mount (its
    disk-budget tmpfs, made in the host's namespace after the template) is taken first; then
    this process enters the template, unshares a copy of its own at once, so nothing it mounts
    reaches the template or a sibling, and attaches the staging dir at its own path."""
    tree = _detached_copy(staging, nr, False)
    try:
        _check(_libc.setns(template, _CLONE_NEWNS), "setns(CLONE_NEWNS)")
        os.close(template)
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _attach(tree, staging, nr)
    finally:
        os.close(tree)


def _confine(req, rpc, ruleset, template=None):
    """The strict steps of confine/child.rs, in its order, in the script process."""
    # RLIMIT_NOFILE last (confine/child.rs): the namespace step opens descriptors.
    limits = req.get("rlimits", ())
    for res, value in limits:
        if res != resource.RLIMIT_NOFILE:
            resource.setrlimit(res, (value, value))
    if template is not None:
        _enter_template(template, req["template_staging"], req["syscalls"])
    elif req.get("reveal"):
        _reveal(req["reveal"], req["syscalls"])
    creds = req.get("credentials")
    if creds is not None:
        uid, gid = creds
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            raise OSError(errno.EPERM, "the uid change did not stick")
    for res, value in limits:
        if res == resource.RLIMIT_NOFILE:
            resource.setrlimit(res, (value, value))
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    if os.getppid() != req["reaper"]:
        os._exit(127)
    if ruleset is None:
        return
    nr = req["syscalls"]
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(_libc.syscall(ctypes.c_long(nr["landlock_restrict_self"]), ctypes.c_int(ruleset),
                         ctypes.c_uint(0)), "landlock_restrict_self")
    os.close(ruleset)
    # The programs' struct sock_filter arrays follow the message's JSON, back to back; the
    # request gives their lengths in instructions (zygote.rs: `confinement_part`).
    raw, offset = req.get("programs", b""), 0
    for count in req.get("filters", ()):
        size = count * _SOCK_FILTER_SIZE
        if count <= 0 or count > 0xFFFF or offset + size > len(raw):
            raise OSError(errno.EINVAL, "malformed seccomp program")
        fprog = _SockFprog(count, raw[offset:offset + size])
        offset += size
        _check(_libc.syscall(ctypes.c_long(nr["seccomp"]), ctypes.c_uint(1), ctypes.c_uint(0),
                             ctypes.byref(fprog)), "seccomp")


class _PreloadedRuntime:
    """The import of the stub's runtime in a forked script: hands over the module this server
    compiled, adopted for the execution's staging dir, at the script's first import of it
    (`import vibeos_tools` makes it). A script that never imports its tools pays nothing: the
    adoption rewrites every code object of the runtime, which in a forked child also copies the
    pages it touches (about half a millisecond). It leaves `sys.meta_path` once used."""

    def __init__(self, path):
        self.path = path

    def find_spec(self, name, path=None, target=None):
        if name != _RUNTIME_NAME:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        _adopt_runtime(_runtime, self.path)
        return importlib.machinery.ModuleSpec(name, self, origin=self.path)

    def create_module(self, spec):
        return _runtime

    def exec_module(self, module):
        pass


def _adopt_runtime(mod, path):
    """Points the preloaded runtime at this execution's copy of its text (the supervisor writes
    the same text into every staging dir): tracebacks, `inspect` and `__file__` then name the
    file a cold run of this execution would have imported."""

    def moved(code):
        consts = tuple(moved(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_filename=path, co_consts=consts)

    def adopt(fn):
        if isinstance(fn, types.FunctionType) and fn.__globals__ is mod.__dict__:
            fn.__code__ = moved(fn.__code__)

    # adopt() leaves anything the runtime did not define (its globals say whose it is).
    for value in list(vars(mod).values()):
        adopt(value)
        if isinstance(value, type):
            for attr in list(vars(value).values()):
                adopt(attr)
    mod.__file__ = path


def _reseed():
    # State a fork would otherwise share with every sibling (docs/warm-pool.md lists the rest).
    mod = sys.modules.get("random")
    if mod is not None:
        mod.seed()
    mod = sys.modules.get("tempfile")
    if mod is not None:
        mod._name_sequence = None
        mod.tempdir = None


# The descriptors the host waits on for EOF (stdout, stderr, the RPC channel), set in the script
# process.
_host_fds = ()
# The script process's pid, taken once it is forked (not on the call's path).
_script_pid = 0


def _announce_exit(status):
    """Hands the rest of this process's exit to its reaper: lets go of what the host waits on
    (stdout, stderr, the RPC channel), claims `status` in `_claim` and stops. The reaper then
    kills the stopped process and reports the status at once (`_take_claim`), so the host's EOF
    and status do not wait for the kernel to tear down this forked interpreter's address space,
    most of a millisecond (docs/warm-pool.md). Killing a stopped process is what `_exit` would
    have done to any thread still running. If the reaper declines (another process of the
    execution is left), it continues this process, which exits as always.

    Only the script process itself: a process the script forked inherits `_script_pid` and the
    descriptors, and ending its own run here stopped the script process instead (the script
    then hung until its timeout, and its children's output was lost; stop 60's probe). A fork
    exits as it would after a cold start."""
    if not _host_fds or os.getpid() != _script_pid:
        return
    try:
        # Stdin is /dev/null (`_keep_only`): stdout and stderr become it too, without opening
        # it again. Nothing of this process writes after the flush that came before.
        for fd in _host_fds:
            if fd in (1, 2):
                os.dup2(0, fd)
            else:
                os.close(fd)
        _claim.value = status
        # What is left of this process (its teardown once killed) must not preempt the host
        # returning its result.
        _background()
        os.kill(_script_pid, signal.SIGSTOP)
    except OSError:
        pass


def _keep_only(keep):
    """Closes every descriptor not in `keep`, and points stdin at /dev/null."""
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    if sys.version_info < (3, 10):
        # closerange here closes one number at a time, up to the bound: list what is open.
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        return
    # close_range(2) per gap, without listing /proc/self/fd.
    low = 0
    for fd in sorted(k for k in keep if k is not None and k >= 0):
        if fd > low:  # closerange(n, n) would close everything from n up
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAX_FD)


# Above any descriptor a process can hold (RLIMIT_NOFILE's hard ceiling, fs.nr_open, is 2^30).
_MAX_FD = 1 << 30


def _take_confinement(part, fds, reaper, chan):
    """Strict mode, ahead of the request (the supervisor primes a spare with the confinement of
    the staging dir it prepared next, zygote.rs `prime`): descriptors, then the steps of
    `_confine`, so the script process that later gets its request is already the confined
    process a cold launch would exec. Besides stdio, the process keeps only the channel the
    request comes on and the RPC end, which it returns (the ruleset and the mount namespace
    template, when one comes, are closed once used)."""
    if len(fds) not in (2, 3) or (len(fds) == 3) != ("template_staging" in part):
        raise OSError(errno.EINVAL, "a confinement comes with the RPC end, the ruleset and "
                      "the mount namespace template it names, if any")
    rpc, ruleset = fds[0], fds[1]
    template = fds[2] if len(fds) == 3 else None
    _keep_only({0, 1, 2, chan.fileno(), rpc, ruleset, template})
    os.set_inheritable(rpc, True)
    _confine(dict(part, reaper=reaper), rpc, ruleset, template)
    return rpc


def _script_process(req, fds, rpc=None, settled=False):
    """Runs in the script's process, confined already in strict mode (`rpc` is then the RPC end
    its confinement came with): stdio, environment, script. `settled`: the request is the one
    this process was preset with (`_settle` ran while it waited)."""
    _foreground()
    # The C function: `signal`'s wrapper turns the old mask into enum members, which cost a
    # forked child tens of microseconds of cold code.
    _signal.pthread_sigmask(signal.SIG_SETMASK, ())
    # Project mode has nothing to confine, and the spare let go of every other descriptor and
    # armed its parent-death signal once forked (`_fork_script_process`); a strict one was
    # confined by the message before (`_take_confinement`). Either way nothing but stdout and
    # stderr and the channel (closed by the caller) was opened since, and /proc may be out of
    # reach.
    if len(fds) != 2:
        raise OSError(errno.EINVAL, "a request comes with stdout and stderr")
    stdout_w, stderr_w = fds
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.close(stdout_w)
    os.close(stderr_w)
    global _host_fds
    _host_fds = (1, 2) if rpc is None else (1, 2, rpc)
    if not settled:
        _settle(req, rpc)
    _customize()
    _finish(*_run(req["script"], req.get("source")))


# What `_settle` changed in this process, so that a request other than the preset one can
# undo it first (`_unsettle`): the variables' earlier values, sys.path, the runtime's finder.
_settled = None


def _settle(req, rpc):
    """The request's working dir, environment, sys.path and the stub runtime's hand-over, and
    fresh random state: at the request, or ahead of it when the supervisor presets a waiting
    spare with the request it expects (zygote.rs `preset`), which then takes none of this
    process's time on the call's path."""
    global _settled, _staging, _customize_plan
    os.chdir(req["cwd"])
    # Only the differences (zygote.rs `env_delta`): the server started with this key's
    # environment (its own empty dir standing in for the staging dir), so most variables
    # already hold their values, and each putenv in a forked child costs copied pages.
    changes = list(req["unset"]) + [name for name, _value in req["set"]]
    if rpc is not None:
        changes.append("VIBEOS_RPC_FD")
    undo = [(name, os.environ.get(name)) for name in changes]
    _settled = (undo, None, None)
    for name in req["unset"]:
        os.environ.pop(name, None)
    for name, value in req["set"]:
        os.environ[name] = value
    if rpc is not None:
        os.environ["VIBEOS_RPC_FD"] = str(rpc)
    saved_path = list(sys.path)
    _settled = (undo, saved_path, None)
    # PYTHONPATH named the zygote's empty dir where this execution's staging dir belongs.
    _staging = staging = req["staging"]
    if _pythonpath_at_start:
        sys.path[:] = [staging if p == _empty else p for p in sys.path]
        sys.path[0] = staging
    else:
        sys.path[:] = _with_pythonpath(sys.path, staging, os.environ.get("PYTHONPATH", ""))
    finder = _PreloadedRuntime(os.path.join(staging, _RUNTIME_NAME + ".py"))
    sys.meta_path.insert(0, finder)
    _reseed()
    _settled = (undo, saved_path, finder)
    _customize_plan = _plan_customize()
    # Everything so far is this process's start, not the script's: the collection at its end
    # (`_finish`) then looks only at what the script made.
    gc.freeze()


def _unsettle():
    """Undoes a preset's `_settle`, for a request that differs from it."""
    global _settled, _customize_plan
    _customize_plan = None
    if _settled is None:
        return
    undo, saved_path, finder = _settled
    for name, value in reversed(undo):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if saved_path is not None:
        sys.path[:] = saved_path
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)
    _settled = None


def _ready_script_process(chan, reaper):
    """The script process's setup that needs no request, done while it waits for one (off the
    call's path): the signal handlers back to what a fresh interpreter has (the signals stay
    blocked until the request, as the server had them); only stdio (stdin on /dev/null) and
    the channel its request comes on left open; killed if its reaper dies (its uid does not
    change in project mode, which would clear that; `_confine` arms it again after a change)."""
    global _script_pid
    _script_pid = os.getpid()
    for sig in _WATCHED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    _keep_only({0, 1, 2, chan.fileno()})
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    if os.getppid() != reaper:
        os._exit(127)


# How long a waiting script process lets a request come before it starts copying its pages
# (`_populate_while_idle`), and the size of each copy between looks at its channel.
_IDLE_BEFORE_POPULATE = 0.02
# How long it lets a request come before its rehearsal (`_rehearse`).
_IDLE_BEFORE_REHEARSAL = 0.06
_POPULATE_CHUNK = 256 << 10
# The largest mapping copied: a larger one is likely a mostly untouched reservation.
_POPULATE_LIMIT = 64 << 20


def _private_mappings():
    """The private writable mappings worth copying (`_populate_while_idle`), as (start, end).
    A reaper reads them once, and its script processes, forks of it, use that list: a strict
    spare otherwise had to open /proc/self/maps before landlock in every execution, whether
    or not it would wait long enough to copy anything. A mapping made or grown since is copied
    at its first write, as without the copy; one gone since stops the copy."""
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read().splitlines()
    except OSError:
        return []
    ranges = []
    for line in maps:
        fields = line.split()
        if len(fields) < 5 or fields[1][:2] != b"rw" or fields[1][3:4] != b"p":
            continue
        if len(fields) > 5 and fields[5].startswith(b"[") and fields[5] != b"[heap]":
            continue
        start, end = (int(x, 16) for x in fields[0].split(b"-"))
        if end - start <= _POPULATE_LIMIT:
            ranges.append((start, end))
    return ranges


def _populate_while_idle(chan, ranges):
    """While no message comes, copies the private writable pages this fork shares with the
    server (MADV_POPULATE_WRITE, Linux 5.14), a chunk at a time: the script then writes its
    own pages instead of taking a copy-on-write fault at its first write of each, which cost a
    paced no-op call a millisecond and a half. It starts only once the spare has waited a
    moment, and stops as soon as a message is there, so calls that come back to back never
    wait for it (copying all of it takes a few milliseconds of CPU). `ranges` are the reaper's
    private writable mappings (`_private_mappings`), which this fork of it shares. Pages
    already copied cost little a second time. Quietly nothing on older kernels."""
    started = time.monotonic()
    ready = select.poll()
    ready.register(chan, select.POLLIN)
    if ready.poll(int(_IDLE_BEFORE_POPULATE * 1000)):
        return
    for start, end in ranges:
        while start < end:
            if ready.poll(0):
                return
            size = min(_POPULATE_CHUNK, end - start)
            if _libc.madvise(start, size, 23) != 0:
                return  # MADV_POPULATE_WRITE refused (older kernel) or the mapping is gone
            start += size
    # Later than the copy: a spare that waits this long is one of a paced host's, where
    # one of calls back to back waiting in line behind others would spend a core the calls
    # ahead of it need.
    left = _IDLE_BEFORE_REHEARSAL - (time.monotonic() - started)
    if not ready.poll(max(0, int(left * 1000))):
        _rehearse()


def _rehearse():
    """A compile and a collection while the spare waits: the first of each in a forked
    process allocates memory it then faults in page by page (a paced no-op's compile took
    four faults and most of a tenth of a millisecond), which the script's own compile and
    its exit's collection now find mapped. Nothing of a request is in this process yet, or
    only its preset (`_settle`), which neither reads."""
    _warm_up_compiler()
    gc.collect()


def _request(msg):
    """A script process's message. Its confinement (sent ahead, or just before the request) is
    JSON, then optionally a NUL and the seccomp programs' bytes, which go with it as
    "programs". Its request is NUL-separated fields (zygote.rs `script_request`): cwd, staging
    dir, script path, the number of variables to set, their names and values, then the names
    to remove."""
    if msg[:1] == b"{":
        text, _nul, programs = msg.partition(b"\0")
        req = json.loads(text.decode("utf-8"))
        part = req.get("confine", req)
        part["programs"] = programs
        return req
    fields = msg.decode("utf-8").split("\0")
    if len(fields) < 4 or not fields[3].isdigit() or len(fields) < 4 + 2 * int(fields[3]):
        raise OSError(errno.EINVAL, "malformed request")
    end = 4 + 2 * int(fields[3])
    values = fields[4:end]
    return {"cwd": fields[0], "staging": fields[1], "script": fields[2],
            "set": list(zip(values[0::2], values[1::2])), "unset": fields[end:]}


# A script process's messages besides its confinement (JSON) and its request (fields, the
# first an absolute path): the request the supervisor expects, sent ahead (zygote.rs
# `preset`), and the word that it is the one, with stdout and stderr (and the script's bytes
# after it).
_PRESET = b"preset\0"
_GO = b"go\0"
# A call is on its way (zygote.rs `wake_ahead`): the process watches its channel, without
# sleeping, for at most this long.
_WAKE = b"wake\0"
_WAKE_WATCH = 0.003


def _watch(chan, limit):
    """Looks at `chan` until a message is there or `limit` seconds have passed, without
    sleeping: a process that sleeps on an idle CPU of a virtual machine takes 0.1–0.3 ms to
    run again once woken, which a call woke it ahead of its request to avoid."""
    ready = select.poll()
    ready.register(chan, select.POLLIN)
    end = time.monotonic() + limit
    while not ready.poll(0):
        if time.monotonic() >= end:
            return
        # Only the CPU time nothing else wants: the call's own processes run first.
        os.sched_yield()

# Room for the descriptors a message on a spare's or the server's channel carries.
_FDS_SPACE = socket.CMSG_SPACE(8 * array.array("i").itemsize)


def _passed_fds(anc):
    """The descriptors that came as SCM_RIGHTS in a message's ancillary data."""
    fds = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - (len(data) % a.itemsize)])
            fds.extend(a)
    return fds


def _receive(chan):
    """One message and the descriptors that came with it; (None, []) at EOF. Sizes and
    truncation are checked by the caller that knows what it expects."""
    while True:
        try:
            msg, anc, flags, _addr = chan.recvmsg(_MAX_MESSAGE, _FDS_SPACE)
            break
        except InterruptedError:
            continue
    fds = _passed_fds(anc)
    if not msg:
        for fd in fds:
            os.close(fd)
        return None, [], flags
    return msg, fds, flags


# The largest message this process takes on any channel: a script process's request carries
# the environment's changes.
_MAX_MESSAGE = 1 << 22
# An inbox's buffer: a `go` with a script of up to 64 KiB (zygote.rs `INLINE_SOURCE`) fits.
_INBOX_SIZE = 68 << 10


class _Inbox:
    """A script process's messages, received into a buffer made while it waits. `recvmsg`
    allocates a buffer of the largest size for every message (an mmap and munmap of 4 MiB, a
    tenth of a millisecond of a paced call's path), where this copies only what came. A
    message is measured first (a peek), so one larger than the buffer, a request with a large
    environment say, is received whole into a buffer of its own. The buffer is heap memory,
    zeroed (so its pages are faulted in) while the process waits, and freed like any object:
    a mapping would have to be unmapped before the script, whose RLIMIT_DATA it counts
    against, and that cost a paced call 0.08-0.1 ms."""

    def __init__(self):
        self.buf = bytearray(_INBOX_SIZE)
        self.view = memoryview(self.buf)
        self.used = 0

    def close(self):
        """Frees the buffer, first zeroing what messages were written to it: freed heap
        memory stays readable to the script."""
        self.view[: self.used] = bytes(self.used)
        self.view.release()
        self.view = self.buf = None

    def receive(self, chan):
        """One message and the descriptors that came with it; (None, []) at EOF."""
        # MSG_TRUNC: the whole message's length, though one byte is peeked. (A signal does
        # not interrupt it: Python retries the call, PEP 475.)
        size = chan.recv_into(self.buf, 1, socket.MSG_PEEK | socket.MSG_TRUNC)
        if size > len(self.buf):
            msg, fds, flags = _receive(chan)
        else:
            size, fds, flags = _receive_into(chan, self.buf)
            self.used = max(self.used, size)
            msg = bytes(self.view[:size]) if size else None
        if msg is None:
            return None, []
        if flags & socket.MSG_TRUNC:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EMSGSIZE, "a request larger than %d bytes" % _MAX_MESSAGE)
        return msg, fds


def _spare(for_reaper, for_script):
    """A spare execution, forked ahead of its request (`_make_spare`): the reaper's setup that
    does not depend on the request (own session, subreaper, signal handlers) is done, and the
    script process is already forked and waits for its request on `for_script`. The reaper
    waits for its part (lifeline, status pipe, kill grace, staging dir) on `for_reaper`, and
    from there is the execution's reaper, as reaper.rs: it relays termination, kills every
    descendant once the script is gone, and reports the script's wait status. The supervisor
    holds the other ends: EOF on either channel before a request means the spare was dropped
    unused, and both processes exit.

    After an execution that ended on its own, once the supervisor has let go of it (its
    lifeline closed), the reaper hands itself back to the server as a spare again
    (`_hand_back`) and, once the server has kept it (`_kept`), forks its next script process:
    a warm execution then costs no fork of the server and no reaper's setup and exit."""
    zygote = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Nothing of the server's other spares stays open here: a copy of one of their channels
    # would keep a dropped spare from seeing its EOF for as long as this reaper lives.
    _ctl.close()
    _returns.close()
    for fd in _pidfds.values():
        os.close(fd)
    _pidfds.clear()
    for _pid, to_r, to_s in _returned:
        to_r.close()
        to_s.close()
    del _returned[:]
    os.setsid()
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    flags = {"stop": False}

    def on_signal(signo, _frame):
        if signo != signal.SIGCHLD:
            flags["stop"] = True

    for sig in _WATCHED:
        signal.signal(sig, on_signal)
    signal.set_wakeup_fd(wake_w)
    me = os.getpid()
    ranges = _private_mappings()
    while True:
        script = _fork_script_process(for_reaper, for_script, me, (wake_r, wake_w), ranges)
        for_script.close()
        claims = _ClaimReader(script)
        try:
            again = _reap(script, claims, for_reaper, zygote, me, wake_r, flags)
        except BaseException:
            # Never leave a script process without its reaper.
            _kill_everything_below()
            raise
        finally:
            # Not inherited by the next script process.
            claims.close()
        if not again:
            os._exit(0)
        _background()
        # Blocked until the next request, as a spare forked by the server has them.
        signal.pthread_sigmask(signal.SIG_BLOCK, set(_WATCHED))
        flags["stop"] = False
        to_reaper, for_reaper = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        to_script, for_script = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Handed back before the next script process is forked: a server that has enough
        # reapers waiting lets this one go, and then no fork is spent on it.
        if not _hand_back(me, (to_reaper, to_script)) or not _kept(for_reaper):
            os._exit(0)


def _fork_script_process(for_reaper, for_script, reaper, close_in_child, ranges):
    """Forks the spare's script process, which waits for its request on `for_script`; returns
    its pid. `close_in_child` are this reaper's descriptors it must not keep; `ranges` its
    mappings, for the child's copy of its pages while it waits."""
    script = os.fork()
    if script != 0:
        return script
    for fd in close_in_child:
        os.close(fd)
    for_reaper.close()
    _returns_w.close()
    try:
        _ready_script_process(for_script, reaper)
        inbox = _Inbox()
        rpc, failed, preset, settled = None, None, None, False
        while True:
            # Waiting stays SCHED_BATCH: a wake-up ahead (`_WAKE`) often lands on the CPU of
            # the supervisor thread that sent it, and a process at the host's policy then
            # took that CPU from the call's own preparation for a tenth of a millisecond.
            _populate_while_idle(for_script, ranges)
            msg, fds = inbox.receive(for_script)
            if msg is None:
                os._exit(0)
            if msg == _WAKE:
                for fd in fds:
                    os.close(fd)
                _watch(for_script, _WAKE_WATCH)
                continue
            if msg.startswith(_PRESET):
                # The first preset counts; one after a failed confinement is only kept, so that
                # its request reports that failure as any other would.
                for fd in fds:
                    os.close(fd)
                if preset is None:
                    preset = _request(msg[len(_PRESET):])
                    if failed is None:
                        try:
                            _settle(preset, rpc)
                            settled = True
                        except Exception:
                            # Its working dir was missing, say: the request settles again
                            # when it comes, and fails there as a cold start would.
                            _unsettle()
                continue
            if msg.startswith(_GO):
                if preset is None:
                    raise OSError(errno.EINVAL, "no preset request to go with")
                req = preset
                # The script's bytes, which the supervisor also wrote to its file (for
                # tracebacks and `__file__`); none when too large to come along.
                if len(msg) > len(_GO):
                    req["source"] = msg[len(_GO):]
                break
            req = _request(msg)
            if "confine" not in req:
                _unsettle()
                settled = False
                break
            if rpc is not None or failed is not None or preset is not None:
                raise OSError(errno.EINVAL, "a spare is confined once, before any preset")
            # Armed: from here this process is an execution's, and in a strict call back to
            # back the next call waits for this confinement.
            _foreground()
            try:
                rpc = _take_confinement(req["confine"], fds, reaper, for_script)
            except Exception as exc:
                # Half confined at most: this process never runs a script. The error
                # goes to the request's own stderr, where a cold start would put it.
                failed = exc
        if failed is not None:
            if len(fds) > 1:
                os.dup2(fds[1], 2)
            raise failed
        for_script.close()
        # The request's fields are copies: the buffer goes back to the heap.
        inbox.close()
        _script_process(req, fds, rpc, settled)
    except BaseException as exc:  # never let the child fall back into the reaper's loop
        try:
            os.write(2, ("vibeos: cannot start the script: %s\n" % exc).encode())
        finally:
            os._exit(126)
    os._exit(126)


def _hand_back(me, ends):
    """Hands the server this reaper's next spare (the supervisor's ends of its two channels);
    closes our copies. False if the server is gone or refused it."""
    to_reaper, to_script = ends
    try:
        _returns_w.sendmsg([b"%d" % me], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           array.array("i", [to_reaper.fileno(),
                                                             to_script.fileno()]))])
        return True
    except OSError:
        return False
    finally:
        to_reaper.close()
        to_script.close()


def _kept(for_reaper):
    """Whether the server kept the spare this reaper handed back: it says so with one message
    on the reaper's channel, ahead of any request, and closes the channel if it does not."""
    try:
        return for_reaper.recv(16) == _KEEP
    except OSError:
        return False


def _reap(script, claims, for_reaper, zygote, me, wake_r, flags):
    """One execution, as its reaper: waits for its part, then relays termination, takes the
    script's exit claim, kills every descendant once the script is gone and reports its status.
    Returns whether this reaper may serve another execution: the script ended on its own,
    nothing was terminated, and the supervisor has since let go of the execution (closed the
    lifeline) without exiting, so it can send this process no late signal meant for it.
    `claims` reads the script's exit claim."""
    # The reaper's part of the request, read into a buffer of ours rather than a new object,
    # and parsed without making its staging dir's path an object, so that the reaper can zero
    # it before it forks the script process of a later execution: that process starts from a
    # copy of this one.
    part = bytearray(_PART_SIZE)
    size, fds, _flags = _receive_into(for_reaper, part)
    _foreground()
    for_reaper.close()
    if size == 0 or len(fds) != 2:
        # Discarded before use (the server ended): the script process got EOF as well.
        for fd in fds:
            os.close(fd)
        _kill_everything_below()
        return False
    lifeline, status_w = fds
    # Blocked since before the fork, so no signal was lost; from here the handlers wake poll.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_WATCHED))
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.register(lifeline, select.POLLIN)
    grace = _grace_of(part, size)
    status, kill_at, terminating, lifeline_eof = None, None, False, False
    # Set when the lifeline closes after the report: the supervisor has let go.
    reported, released = False, False
    while True:
        left = True
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                left = False
                break
            if pid == 0:
                break
            if pid == script:
                status = st
        # Also while terminating: a script that ends on SIGTERM (its handler exits) claims
        # its status like any other, and holding it stopped until the SIGKILL would cost the
        # whole grace period and report -9 where a cold run reports its exit code.
        if status is None and not reported:
            claim = _take_claim(claims)
            if claim is not None:
                os.write(status_w, b"%d\n" % (claim << 8))
                reported = True
                _background()
        if status is not None:
            # An orphan becomes this subreaper's child while its parent exits, before that
            # parent can be waited for: with no child left, no descendant is left either.
            if left:
                _kill_everything_below()
            # The lifeline's EOF comes when the supervisor's last thread closes its files, a
            # moment before the server (our parent) sees its own EOF and exits: a supervisor
            # that is exiting counts as gone.
            orphaned = os.getppid() != zygote or (lifeline_eof and _exiting(_supervisor))
            if orphaned:
                _sweep(json.loads(bytes(part[:size]))["staging"])
            if not reported:
                os.write(status_w, b"%d\n" % status)
                _background()
            os.close(status_w)
            if orphaned or terminating or lifeline_eof or flags["stop"]:
                return False
            part[:] = bytes(_PART_SIZE)
            # A late signal (a timeout that crossed the report) means the supervisor did not
            # take the report as the end: this reaper is not used again.
            return _let_go(lifeline, zygote, released) and not flags["stop"]
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            _signal_tree(me, signal.SIGKILL)
            kill_at = None
        timeout = None if kill_at is None else max(0, int((kill_at - now) * 1000) + 1)
        for fd, _ev in poller.poll(timeout):
            if fd == lifeline and reported:
                poller.unregister(lifeline)
                released = True
            elif fd == lifeline:
                poller.unregister(lifeline)
                lifeline_eof = True
                flags["stop"] = True
            else:
                try:
                    os.read(wake_r, 512)
                except OSError:
                    pass
        # After a taken claim nothing is left to stop: the script was the last process.
        if flags["stop"] and not terminating and not reported:
            terminating = True
            _signal_tree(me, signal.SIGTERM)
            kill_at = time.monotonic() + grace


# Room for the reaper's part of a request: its kill grace and staging dir's path.
_PART_SIZE = 4096


def _receive_into(chan, buf):
    """One message read into `buf`, its descriptors and the receive flags; (0, [], flags) at
    EOF, its descriptors closed. Sizes and truncation are checked by the caller."""
    while True:
        try:
            size, anc, flags, _addr = chan.recvmsg_into([buf], _FDS_SPACE)
            break
        except InterruptedError:
            continue
    fds = _passed_fds(anc)
    if size == 0:
        for fd in fds:
            os.close(fd)
        return 0, [], flags
    return size, fds, flags


def _grace_of(part, size):
    """The kill grace, in seconds, of a reaper's part (JSON with a "grace_ms" number)."""
    key = b'"grace_ms":'
    at = part.find(key, 0, size)
    if at < 0:
        raise ValueError("a reaper's part without its kill grace")
    at += len(key)
    end = at
    while end < size and part[end] in b" 0123456789":
        end += 1
    return int(part[at:end]) / 1000.0


def _let_go(lifeline, zygote, released):
    """After the report: waits until the supervisor closes the lifeline (unless it did
    already, `released`), which it does once it is done with the execution (it never signals
    the reaper after that). True if this reaper may then serve another one: the server is
    still its parent and the supervisor is not exiting."""
    if not released:
        waiting = select.poll()
        waiting.register(lifeline, select.POLLIN)
        while not waiting.poll():
            pass
    os.close(lifeline)
    return os.getppid() == zygote and not _exiting(_supervisor)


def _make_spare():
    """Forks one spare execution (`_spare`); returns the reaper's pid, a pidfd for it and the
    server's ends of its two channels. The pidfd is opened while SIGCHLD is blocked, before the
    server could reap the reaper, so it names that process even if it dies unused and its pid
    is reused."""
    to_reaper, for_reaper = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    to_script, for_script = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    signal.pthread_sigmask(signal.SIG_BLOCK, set(_WATCHED))
    try:
        pid = os.fork()
        if pid == 0:
            try:
                to_reaper.close()
                to_script.close()
                _spare(for_reaper, for_script)
            finally:
                os._exit(126)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: SIGCHLD is blocked
            to_reaper.close()
            to_script.close()
            raise
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_WATCHED))
        for_reaper.close()
        for_script.close()
    return pid, pidfd, to_reaper, to_script


def _forget_reaped():
    """Closes the pidfds of reapers the SIGCHLD handler reaped, and lets go of spares they
    handed back."""
    while _reaped:
        pid = _reaped.pop()
        fd = _pidfds.pop(pid, None)
        if fd is not None:
            os.close(fd)
    for entry in [e for e in _returned if e[0] not in _pidfds]:
        _returned.remove(entry)
        entry[1].close()
        entry[2].close()


def _take_returned():
    """Takes one spare a reaper handed back (`_hand_back`), or lets it go (the reaper and its
    script process exit at EOF) if enough wait already or the sender is not a live reaper of
    ours."""
    msg, fds, _fl = _receive(_returns)
    socks = []
    try:
        for fd in fds:
            socks.append(socket.socket(fileno=fd))
    except OSError:
        for fd in fds[len(socks):]:
            os.close(fd)
        for s in socks:
            s.close()
        return
    try:
        pid = int(msg)
    except (TypeError, ValueError):
        pid = None
    if pid in _pidfds and len(socks) == 2 and len(_returned) < _KEEP_RETURNED:
        try:
            socks[0].send(_KEEP)  # the reaper forks its script process at this (`_kept`)
            _returned.append((pid, socks[0], socks[1]))
            return
        except OSError:
            pass
    for s in socks:
        s.close()


def _a_spare():
    """A spare for the supervisor: one handed back by its reaper if one waits, else a fresh
    fork. Returns (pid, pidfd, to_reaper, to_script, recycled); the pidfd stays ours."""
    _forget_reaped()
    while _returned:
        pid, to_reaper, to_script = _returned.pop(0)
        if pid in _pidfds:
            return pid, _pidfds[pid], to_reaper, to_script, True
        to_reaper.close()
        to_script.close()
    pid, pidfd, to_reaper, to_script = _make_spare()
    _pidfds[pid] = pidfd
    return pid, pidfd, to_reaper, to_script, False


def _serve():
    _background()
    signal.signal(signal.SIGCHLD, _reap_all)
    # Ctrl-C of a terminal host or a hangup must not end the server between requests: the
    # supervisor ends it by closing the control channel.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm_up_compiler()
    _note_customize_absent()
    gc.freeze()
    _ctl.sendall(b"R")
    waiting = select.poll()
    waiting.register(_ctl, select.POLLIN)
    waiting.register(_returns, select.POLLIN)
    # The only request is "a spare, please" with an id. The spare's channels go to the
    # supervisor, which sends each process its part of an execution's request directly: the
    # server never holds a request, so nothing of one execution is in the next one's copy.
    while True:
        _forget_reaped()
        ready = [fd for fd, _ev in waiting.poll()]
        if _returns.fileno() in ready:
            _take_returned()
        if _ctl.fileno() not in ready:
            continue
        msg, fds, flags = _receive(_ctl)
        if msg is None:
            # A host that was killed cannot remove this dir (in the staging area), nor the
            # area's parent when it was the last one there; the server can.
            for d in (_empty, os.path.dirname(_empty)):
                try:
                    os.rmdir(d)
                except OSError:
                    break
            os._exit(0)
        for fd in fds:
            os.close(fd)
        try:
            rid = int(json.loads(msg.decode("utf-8"))["id"])
        except Exception:
            _ctl.sendall(json.dumps({"error": "malformed request"}).encode())
            continue
        try:
            pid, pidfd, to_reaper, to_script, recycled = _a_spare()
        except OSError as exc:
            _ctl.sendall(json.dumps({"error": "cannot fork a spare: %s" % exc,
                                     "id": rid}).encode())
            continue
        try:
            _ctl.sendmsg([json.dumps({"pid": pid, "id": rid, "recycled": recycled}).encode()],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array("i", [pidfd, to_reaper.fileno(), to_script.fileno()]))])
        finally:
            to_reaper.close()
            to_script.close()

if not hasattr(os, "pidfd_open"):
    sys.stderr.write("the fork server needs Python 3.9 or newer (os.pidfd_open)\n")
    os._exit(3)
_serve()
