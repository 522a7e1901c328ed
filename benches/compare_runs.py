"""Interleaved wall-time medians of whole commands, each as a ratio to the first.

For A/B runs of two builds of the CLI against the interpreter alone, where a benchmark that
measures one binary cannot show the difference (the VM's speed moves by a third within minutes,
so only rounds interleaved with each other compare):

    cp target/release/vibeos-exec /tmp/before   # build, then:
    PATH=$PWD/target/pyvenv/bin:$PATH python3 benches/compare_runs.py 60 \\
        pass="python3 -c pass" before="/tmp/before run noop.py" \\
        after="target/release/vibeos-exec run noop.py"

Arguments: the number of rounds, then NAME=COMMAND pairs (split on spaces; no quoting inside).
Each round runs every command once, in order, with stdout discarded.
"""

import statistics
import subprocess
import sys
import time


def main(argv):
    if len(argv) < 3 or not argv[1].isdigit():
        sys.exit("usage: compare_runs.py ROUNDS NAME=COMMAND [NAME=COMMAND ...]")
    rounds = int(argv[1])
    commands = {}
    for pair in argv[2:]:
        name, sep, command = pair.partition("=")
        if not sep or not command.split():
            sys.exit("not NAME=COMMAND: %r" % pair)
        commands[name] = command.split()
    times = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
            times[name].append(time.perf_counter() - start)
    first = statistics.median(next(iter(times.values())))
    for name, samples in times.items():
        median = statistics.median(samples)
        print("%-12s %8.2f ms  ratio %.3f" % (name, median * 1000, median / first))


if __name__ == "__main__":
    main(sys.argv)
