# A script as an agent would write it: several tool calls, logic between them, one summary.
from vibeos_tools import write_file, read_file
import json

notes = {"alpha.txt": "one\ntwo\nthree\n", "beta.txt": "four\nfive\n"}
for name, text in notes.items():
    write_file("/tmp/vibeos-quickstart/" + name, text)

summary = []
for name in notes:
    page = read_file("/tmp/vibeos-quickstart/" + name)
    summary.append({"file": name, "lines": page["total_lines"], "first": page["content"].splitlines()[0]})

print(json.dumps(summary, indent=2))
