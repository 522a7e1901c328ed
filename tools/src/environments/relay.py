# vibeos-exec relay, started inside a sandbox the host cannot mount a socket into (daytona,
# modal) as `python3 -u -B -c <this>`. Its stdin and stdout are the two directions of ONE
# streaming exec; everything an execution needs rides on them as frames, so a tool call costs
# one frame each way and nothing polls. Frames are ASCII lines `TAG CHAN [BASE64]\n` (text, so
# they survive transports that carry strings, such as a toolbox's "send input" call).
#   host -> relay: L 0 path    bind the script's UNIX socket at path (its dir made 0700)
#                  B 0 json    start {"argv": [...], "stdin": base64} in a new session
#                  D n data    bytes for connection n        C n   close connection n
#                  K 0 name    signal the child's process group (TERM, KILL, INT); KILL spares
#                              the child itself (the bootstrap: it reaps, sweeps and reports)
#   relay -> host: R 0         listening                      O n   a client connected
#                  D n data    bytes from connection n        C n   connection n closed
#                  1 0 data    child stdout                   2 0 data  child stderr
#                  X 0 code    child exited (-N: signal N)    E 0 text  relay error
#                  P 0 "c r"   the child started with pid c (the relay's own pid is r)
# EOF on stdin means the host is gone: the child's whole group is killed. After X the relay removes
# its socket and exits by itself, so the exec ends without a host round trip.
import base64, json, os, signal, socket, subprocess, sys, threading

CHUNK = 65536
out = sys.stdout.buffer
wlock = threading.Lock()
conns = {}
clock = threading.Lock()
state = {"child": None, "path": None, "next": 0}


def send(tag, chan=0, data=None):
    line = tag + b" " + str(chan).encode()
    if data is not None:
        line += b" " + base64.b64encode(data)
    with wlock:
        try:
            out.write(line + b"\n")
            out.flush()
        except (OSError, ValueError):
            os._exit(1)


def drop(chan, tell):
    with clock:
        s = conns.pop(chan, None)
    if s is None:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
    if tell:
        send(b"C", chan)


def pump_conn(chan, s):
    while True:
        try:
            data = s.recv(CHUNK)
        except OSError:
            data = b""
        if not data:
            drop(chan, True)
            return
        send(b"D", chan, data)


def accept(lst):
    while True:
        try:
            s, _ = lst.accept()
        except OSError:
            return
        with clock:
            state["next"] += 1
            chan = state["next"]
            conns[chan] = s
        send(b"O", chan)
        threading.Thread(target=pump_conn, args=(chan, s), daemon=True).start()


def listen(path):
    d = os.path.dirname(path)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
        send(b"E", 0, ("socket dir %s is not a private directory of this user" % d).encode())
        return
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        lst.bind(path)
    finally:
        os.umask(old)
    lst.listen(64)
    state["path"] = path
    threading.Thread(target=accept, args=(lst,), daemon=True).start()
    send(b"R")


def pump_out(tag, pipe):
    while True:
        data = os.read(pipe.fileno(), CHUNK)
        if not data:
            return
        send(tag, 0, data)


def boot(spec):
    spec = json.loads(spec)
    child = subprocess.Popen(spec["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    state["child"] = child
    # The host's kill backstop reaches the child by this pid through a fresh process when the
    # relay itself cannot act (a script may stop it): sent before the child has read its input,
    # so before the script can run.
    send(b"P", 0, ("%d %d" % (child.pid, os.getpid())).encode())
    readers = [threading.Thread(target=pump_out, args=(t, p), daemon=True)
               for t, p in ((b"1", child.stdout), (b"2", child.stderr))]
    for r in readers:
        r.start()

    def feed():
        try:
            child.stdin.write(base64.b64decode(spec.get("stdin", "")))
            child.stdin.close()
        except OSError:
            pass

    def wait():
        code = child.wait()
        for r in readers:
            r.join()
        finish()
        send(b"X", 0, str(code).encode())
        os._exit(0)

    threading.Thread(target=feed, daemon=True).start()
    threading.Thread(target=wait, daemon=True).start()


def spare_leader():
    # The host's KILL is for the script, not the bootstrap (our child, the group's leader): it
    # shares the script's group, and killed with it nothing would reap the script, sweep what it
    # started in sessions of its own (a TERM-ignoring script's setsid'd child ran on under
    # init) or report its end. So every other member is killed and the leader resumed (the
    # script may have stopped it); False when /proc cannot be read.
    child = state["child"]
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for e in entries:
        if not e.isdigit() or int(e) == child.pid:
            continue
        try:
            with open("/proc/%s/stat" % e) as f:
                pgrp = int(f.read().rsplit(")", 1)[1].split()[2])
        except (OSError, IndexError, ValueError):
            continue
        if pgrp == child.pid:
            try:
                os.kill(int(e), signal.SIGKILL)
            except OSError:
                pass
    try:
        os.kill(child.pid, signal.SIGCONT)
    except OSError:
        pass
    return True


def killgroup(name, spare=False):
    child = state["child"]
    if child is None or child.poll() is not None:
        return
    sig = getattr(signal, "SIG" + name, signal.SIGKILL)
    if spare and sig == signal.SIGKILL and spare_leader():
        return
    try:
        os.killpg(child.pid, sig)
    except OSError:
        try:
            child.send_signal(sig)
        except OSError:
            pass


def finish():
    if state["path"]:
        try:
            os.unlink(state["path"])
        except OSError:
            pass
    for chan in list(conns):
        drop(chan, True)


def main():
    for line in sys.stdin.buffer:
        parts = line.split()
        if len(parts) < 2:
            continue
        tag, chan = parts[0], int(parts[1])
        data = base64.b64decode(parts[2]) if len(parts) > 2 else b""
        try:
            if tag == b"D":
                with clock:
                    s = conns.get(chan)
                if s is not None:
                    try:
                        s.sendall(data)
                    except OSError:
                        drop(chan, True)
            elif tag == b"C":
                drop(chan, False)
            elif tag == b"L":
                listen(data.decode("utf-8", "surrogateescape"))
            elif tag == b"B":
                boot(data)
            elif tag == b"K":
                killgroup(data.decode(), spare=True)
        except Exception as e:  # a bad frame is reported, never silently dropped
            send(b"E", 0, ("%s frame: %s" % (tag.decode("ascii", "replace"), e)).encode())
    killgroup("KILL")
    finish()
    os._exit(0)


main()
