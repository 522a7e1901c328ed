# PID 1 of a vibeos-exec container: reaps every orphan (scripts' leftovers never pile up as
# zombies) and exits on SIGTERM so `docker stop` is quick.
import os, signal, sys

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
signal.signal(signal.SIGCHLD, lambda *a: None)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    signal.pause()
