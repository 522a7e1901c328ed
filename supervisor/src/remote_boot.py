# vibeos-exec remote bootstrap, started inside a backend (container or ssh host) as
# `python3 -u -B -X utf8 -c <this> PGID_FILE SCOPE` (PGID_FILE may be empty). stdin starts with
# `<length>\0` and that many bytes of NUL-separated fields (no JSON: importing json would add to
# every start-up): lifeline flag, work dir, cwd, file count, (name, text)..., env count, (name,
# value)... — the stub and the script never travel in argv — then a second block the same way,
# the report's nonce. The length prefixes let the host keep stdin open afterwards as a lifeline:
# EOF there (the ssh connection or the host dropped) kills the script.
#
# The nonce is read only after the script was forked, by this process alone, which has made
# itself non-dumpable: the script (a fork of this interpreter, so a copy of its memory) never
# holds it, and cannot read it from our memory or our stdin through /proc without
# CAP_SYS_PTRACE. A report on stderr with any other nonce is the script's, and ignored.
# SCOPE marks every process of the execution for the host's sweep: it is in our argv (so in
# the script's, a fork) and in the script's environment as VIBEOS_EXECUTION_SCOPE (so in what
# it execs), and the host kills whatever carries it after an end the bootstrap did not report.
#
# It becomes a session leader, marks itself a child subreaper (so every descendant, even one
# that called setsid and whose parent exited, is re-parented here rather than to init), writes
# the files into a private 0700 work dir and forks the script: the child applies the scrubbed
# environment and runs the script in this same interpreter (one Python start-up per execution,
# not two). The end of the execution is the script process's exit, not EOF on its output: then
# every descendant left is SIGKILLed and reaped, the work dir and PGID_FILE are removed, and the
# script's real wait status (-N for signal N, as the local launch reports it) is written as the
# last bytes on stderr, `\0VIBEOS-END <nonce> exit <code>\0`, which the host strips — the ssh or
# docker client's own exit code cannot tell "killed by signal 9" from "exit 137".
#
# Given PGID_FILE (a backend that skips its `sh`/`setsid` wrapper, see
# Environment::spawn_leader) the script runs in a process group of its own, recorded there, so
# the host's `kill -- -PGID` reaches the script and what it started but not this supervisor,
# which must survive a SIGKILL of the script to clean up and report. Without it (the group
# wrapper or the relay signal our group) the script shares our group.
# Only modules the interpreter has loaded at start-up anyway (plus the builtin `_signal` and
# `_thread`, and `ctypes` for prctl): `signal` alone would pull in `enum` (~8 ms on every
# execution, measured over ssh); SIGKILL is 9 on every POSIX system.
import os, sys, time, _signal, _thread

pgid_file = sys.argv[1] if len(sys.argv) > 1 else ""
scope = sys.argv[2] if len(sys.argv) > 2 else ""
own_group = bool(pgid_file)
try:
    os.setsid()
except OSError:
    pass  # already a session (or group) leader: the group is ours alone either way
me = os.getpid()


def record(value):
    # Written aside and renamed: the host's kill never reads a half-written id.
    tmp = pgid_file + ".t"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, str(value).encode())
    os.close(fd)
    os.rename(tmp, pgid_file)


if pgid_file:
    record(os.getpgid(0))
state = [0, 0]


def on_signal(sig, frame):
    # The host's TERM/INT: pass it to the script's group (when it has its own) and keep
    # supervising; the script's exit decides the end.
    if not state[1]:
        state[1] = sig
    if state[0] and own_group:
        try:
            os.killpg(state[0], sig)
        except OSError:
            pass


for s in (1, 2, 15):
    _signal.signal(s, on_signal)
def block():
    # `<length>\0` and that many bytes, read exactly: nothing after the block (the nonce, after
    # the header) is read early, and None when stdin ends first.
    n = b""
    while len(n) < 20:
        c = os.read(0, 1)
        if not c:
            return None
        if c == b"\0":
            break
        n += c
    try:
        need = int(n)
    except ValueError:
        return None
    chunks, have = [], 0
    while have < need:
        chunk = os.read(0, min(65536, need - have))
        if not chunk:
            return None
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


data = block()
if data is None:
    # The host went away before it sent everything: nothing to run, nobody to tell.
    if pgid_file:
        try:
            os.unlink(pgid_file)
        except OSError:
            pass
    os._exit(125)
f = iter(data.split(b"\0"))


def nxt():
    return next(f).decode("utf-8", "surrogateescape")


lifeline, d, cwd = nxt() == "1", nxt(), nxt()
files = [(nxt(), next(f)) for _ in range(int(nxt()))]
env = dict((nxt(), nxt()) for _ in range(int(nxt())))


def remove_files():
    for root, dirs, names in os.walk(d, topdown=False):
        for n in names:
            try:
                os.unlink(os.path.join(root, n))
            except OSError:
                pass
        for n in dirs:
            try:
                os.rmdir(os.path.join(root, n))
            except OSError:
                pass
    try:
        os.rmdir(d)
    except OSError:
        pass
    if pgid_file:
        for p in (pgid_file, pgid_file + ".t"):
            try:
                os.unlink(p)
            except OSError:
                pass


nonce = [None]


def report(kind, value, code):
    if nonce[0] is None:
        nonce[0] = block() or b"-"
    try:
        os.write(2, b"\0VIBEOS-END " + nonce[0] + (" %s %s\0" % (kind, value)).encode("utf-8", "replace"))
    except OSError:
        pass
    os._exit(code)


try:
    os.mkdir(d, 0o700)
except FileExistsError:
    pass
st = os.lstat(d)
if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
    sys.stderr.write("vibeos-exec: work dir %s is not a private directory of this user\n" % d)
    if pgid_file:
        os.unlink(pgid_file)
    report("error", "the work dir %s is not a private directory of this user" % d, 125)
for name, data in files:
    fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
for k in ("PATH", "HOME", "LANG"):
    if k not in env and k in os.environ:
        env[k] = os.environ[k]
env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
try:
    os.chdir(cwd)
except OSError as e:
    remove_files()
    report("cwd", e.strerror or str(e), 125)
if state[1]:
    remove_files()
    report("exit", -state[1], 128 + state[1])
libc = None
try:
    import ctypes

    libc = ctypes.CDLL(None)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    # PR_SET_DUMPABLE 0: our memory and fds (the nonce, read after the fork) are closed to a
    # same-user script without CAP_SYS_PTRACE; the script sets itself dumpable again.
    libc.prctl(4, 0, 0, 0, 0)
except Exception:
    pass  # no ctypes or no prctl: what double-forks away still goes to init


def descendants():
    # Every process below us: the kernel's children lists when it has them, else a /proc scan.
    if os.path.exists("/proc/%d/task/%d/children" % (me, me)):
        out, todo = [], [me]
        while todo:
            p = todo.pop()
            try:
                tids = os.listdir("/proc/%d/task" % p)
            except OSError:
                continue
            for t in tids:
                try:
                    with open("/proc/%d/task/%s/children" % (p, t)) as c:
                        kids = [int(k) for k in c.read().split()]
                except OSError:
                    kids = []
                out.extend(kids)
                todo.extend(kids)
        return out
    parent = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open("/proc/%s/stat" % e) as s:
                    parent.setdefault(int(s.read().rsplit(")", 1)[1].split()[1]), []).append(int(e))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [me]
    while todo:
        kids = parent.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def sweep():
    # SIGKILL and reap until nothing is left below us (bounded: a process stuck in the kernel
    # must not keep the execution from ending).
    deadline = time.monotonic() + 3
    while True:
        left = descendants()
        for p in left:
            try:
                os.kill(p, 9)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def watch(pid):
    # The lifeline: EOF (or an error) on stdin means the host is gone.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    try:
        os.killpg(pid, 9) if own_group else os.kill(pid, 9)
    except OSError:
        pass


# The script waits on `go` until its group is recorded: a kill read from PGID_FILE before that
# would reach only this supervisor.
go = os.pipe() if own_group else None
pid = os.fork()
if pid == 0:
    _signal.signal(1, 0)
    _signal.signal(2, _signal.default_int_handler)
    _signal.signal(15, 0)
    if own_group:
        os.setpgid(0, 0)
        os.close(go[1])
        os.read(go[0], 1)
        os.close(go[0])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if libc is not None:
        try:
            libc.prctl(4, 1, 0, 0, 0)  # dumpable again: the script's /proc is its own
        except Exception:
            pass
    os.environ.clear()
    os.environ.update(env)
    if scope:
        os.environ["VIBEOS_EXECUTION_SCOPE"] = scope
    script = os.path.join(d, "script.py")
    sys.argv = [script]
    sys.path[:] = [d, cwd] + [p for p in sys.path if p]
    main = type(sys)("__main__")
    main.__file__ = script
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main

    def shown_without_us(kind, value, tb, shown=sys.excepthook):
        # A traceback reads as `python script.py`'s would: this bootstrap's frame left out.
        if tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
            # The traceback printed is the exception's own.
            if isinstance(value, BaseException):
                value = value.with_traceback(tb)
        shown(kind, value, tb)

    sys.excepthook = shown_without_us
    with open(script, "rb") as src:
        code = compile(src.read(), script, "exec")
    exec(code, main.__dict__)
else:
    state[0] = pid
    # Read only now, here: the script's copy of our memory never held it.
    nonce[0] = block() or b"-"
    if own_group:
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child did it first, or has already exited
        record(pid)
        os.close(go[0])
        os.close(go[1])
        if state[1]:
            on_signal(state[1], None)
    if lifeline:
        _thread.start_new_thread(watch, (pid,))
    status = None
    while status is None:
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            break
    code = -os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else (
        os.WEXITSTATUS(status) if status is not None else 255)
    if pgid_file:
        try:
            os.unlink(pgid_file)
        except OSError:
            pass
    sweep()
    remove_files()
    report("exit", code, code if code >= 0 else 128 - code)
