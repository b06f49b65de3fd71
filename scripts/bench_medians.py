"""Medians of a scripts/bench-ab.sh log: each bench_dm run's `ratio b/a` and `(b) process` CPU
per DM, and each bench_task run's `track() per task` ratio, per binary (new, old)."""
import re
import statistics
import sys

runs: dict[tuple[str, str, str], list[float]] = {}
current = None
for line in open(sys.argv[1]):
    header = re.match(r"=== (\w+) (\w+) (\d)", line)
    if header:
        current = (header.group(1), header.group(2))
        continue
    if current is None:
        continue
    patterns = {
        "dm": [("ratio", r"\s+ratio b/a\s+([\d.]+)$"), ("cpu_us", r"\s+\(b\) process\s+([\d.]+) us")],
        "task": [("ratio", r"\s+\(b\) runtime, track\(\) per task\s+\d+ tasks/s\s+ratio b/a\s+([\d.]+)")],
    }[current[0]]
    for name, pattern in patterns:
        found = re.match(pattern, line)
        if found:
            runs.setdefault(current + (name,), []).append(float(found.group(1)))
for key, values in sorted(runs.items()):
    print(" ".join(key), values, "median", statistics.median(values))
