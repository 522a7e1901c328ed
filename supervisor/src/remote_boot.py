# vibeos-exec remote bootstrap: started as `python3 -c <this>` inside a backend (container or
# ssh host). Reads one JSON line from stdin: the work dir, the files to write there (stub and
# script: they never travel in argv), the scrubbed environment, the cwd and the argv to run.
# The script runs in a new session whose id is written to <dir>/pgid so the host can kill the
# whole group; this process stays outside that group, waits, kills what the script left in its
# group, removes the work dir and exits with the script's status (128+N for signal N).
import json, os, shutil, signal, stat, sys

h = json.loads(sys.stdin.readline())
d = h["dir"]
try:
    os.mkdir(d, 0o700)
except FileExistsError:
    pass
st = os.lstat(d)
if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
    sys.stderr.write("vibeos-exec: work dir %s is not a private directory of this user\n" % d)
    sys.exit(125)
for name, text in h["files"].items():
    fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
env = h["env"]
for k in ("PATH", "HOME", "LANG"):
    if k not in env and k in os.environ:
        env[k] = os.environ[k]
env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(h["cwd"])
        os.execvpe(h["argv"][0], h["argv"], env)
    except BaseException as e:
        sys.stderr.write("vibeos-exec: cannot start %s in %s: %s\n" % (h["argv"][0], h["cwd"], e))
        os._exit(126)
with open(os.path.join(d, "pgid.part"), "w") as f:
    f.write(str(pid))
os.rename(os.path.join(d, "pgid.part"), os.path.join(d, "pgid"))
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
try:
    os.killpg(pid, signal.SIGKILL)
except OSError:
    pass
shutil.rmtree(d, ignore_errors=True)
if os.WIFSIGNALED(status):
    sys.exit(128 + os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
