#!/usr/bin/env python3
"""metrics_close.py A.csv B.csv WHAT REL [ABS]: two runs' metrics.csv (rl_trainer --out) agree:
the same columns and rows, and every value but the timings within REL relative, differences
below ABS (default 0) counted as none. Exits non-zero naming the first value that differs."""
import csv
import math
import sys

a_path, b_path, what, rel = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
tiny = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
a, b = (list(csv.reader(open(p))) for p in (a_path, b_path))
assert a[0] == b[0] and len(a) == len(b), f"{what}: the metric tables differ in shape"
worst = 0.0
for ra, rb in zip(a[1:], b[1:]):
    for name, x, y in zip(a[0], ra, rb):
        if name.startswith("timing_s/"):
            continue
        x, y = float(x), float(y)
        if math.isnan(x) or math.isnan(y):  # NaN equals only NaN (nan > tiny is False)
            assert math.isnan(x) and math.isnan(y), f"{what}: {name} {x} against {y}"
            continue
        d = abs(x - y) / max(abs(x), abs(y)) if abs(x - y) > tiny else 0.0
        worst = max(worst, d)
        assert d <= rel, f"{what}: {name} {x} against {y}"
print(f"{what}: largest relative metric difference {worst:.2e}")
