"""Back-to-back warm no-ops through the Python package, for profiling one mode's cost.

    perf stat -e task-clock target/pyvenv/bin/python benches/package_back_to_back.py 300 strict
    perf stat -e task-clock target/pyvenv/bin/python benches/package_back_to_back.py 300 project

Prints the wall time per execution; run under `perf stat` (which follows the host's children:
fork server, reapers, script processes) for the CPU per execution of each mode. Alternate the
modes, and builds, in one session: this VM's speed drifts by a third within minutes.
"""

import sys
import time

import vibeos_exec


def main(argv):
    if len(argv) != 3 or not argv[1].isdigit() or argv[2] not in ("project", "strict"):
        sys.exit("usage: package_back_to_back.py COUNT project|strict")
    count, mode = int(argv[1]), argv[2]
    # The first call starts the fork server; it is not counted.
    vibeos_exec.execute_code("pass", mode=mode)
    start = time.perf_counter()
    for _ in range(count):
        result = vibeos_exec.execute_code("pass", mode=mode)
        if result["status"] != "success":
            sys.exit("an execution failed: %r" % (result,))
    per = (time.perf_counter() - start) / count * 1000
    print("%s: %d back-to-back no-ops, %.2f ms each" % (mode, count, per))


if __name__ == "__main__":
    main(sys.argv)
