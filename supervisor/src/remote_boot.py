# vibeos-exec remote bootstrap, started inside a backend (container or ssh host) as
# `python3 -u -B -X utf8 -c <this> [PGID_FILE]`. stdin holds NUL-separated fields (no JSON:
# importing json would add to every start-up): work dir, cwd, file count, (name, text)..., env
# count, (name, value)... — the stub and the script never travel in argv. It becomes the leader
# of a new process group (the host kills that group on timeout or interrupt) and, given
# PGID_FILE (a backend that skips its `sh`/`setsid` wrapper, see Environment::spawn_leader),
# records the group's id there first thing; it writes the files into a private 0700 work dir,
# applies the scrubbed environment and runs the script in this same interpreter, so a remote
# execution pays for one Python start-up, not two. At exit it kills whatever the script left in
# its group and removes the work dir and PGID_FILE.
# Only modules the interpreter has loaded at start-up anyway: `signal` alone would pull in
# `enum` (~8 ms on every execution, measured over ssh); SIGKILL is 9 on every POSIX system.
import os, sys

pgid_file = sys.argv[1] if len(sys.argv) > 1 else ""
try:
    os.setsid()
except OSError:
    pass  # already a session (or group) leader: the group is ours alone either way
pgid = os.getpgid(0)
if pgid_file:
    fd = os.open(pgid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, str(pgid).encode())
    os.close(fd)
f = iter(sys.stdin.buffer.read().split(b"\0"))
def nxt():
    return next(f).decode("utf-8", "surrogateescape")
d, cwd = nxt(), nxt()
files = [(nxt(), next(f)) for _ in range(int(nxt()))]
env = dict((nxt(), nxt()) for _ in range(int(nxt())))
try:
    os.mkdir(d, 0o700)
except FileExistsError:
    pass
st = os.lstat(d)
if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
    sys.stderr.write("vibeos-exec: work dir %s is not a private directory of this user\n" % d)
    if pgid_file:
        os.unlink(pgid_file)
    sys.exit(125)
for name, data in files:
    fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
for k in ("PATH", "HOME", "LANG"):
    if k not in env and k in os.environ:
        env[k] = os.environ[k]
env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.chdir(cwd)
os.environ.clear()
os.environ.update(env)
script = os.path.join(d, "script.py")
sys.argv = [script]
sys.path[:] = [d, cwd] + [p for p in sys.path if p]


def _vibeos_cleanup(me=os.getpid(), pgid=pgid, d=d, pgid_file=pgid_file, os=os):
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                try:
                    if os.getpgid(int(entry)) == pgid:
                        os.kill(int(entry), 9)
                except OSError:
                    pass
    except OSError:
        pass
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
        try:
            os.unlink(pgid_file)
        except OSError:
            pass


import atexit
atexit.register(_vibeos_cleanup)
main = type(sys)("__main__")
main.__file__ = script
main.__builtins__ = __builtins__
sys.modules["__main__"] = main
with open(script, "rb") as src:
    code = compile(src.read(), script, "exec")
exec(code, main.__dict__)
