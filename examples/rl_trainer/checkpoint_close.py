#!/usr/bin/env python3
"""checkpoint_close.py A.bin B.bin WHAT TOL [MREL MABS]: two rl_trainer checkpoints (model.bin of
an --f64 run) are the same run's state:
- the header: the flags' fingerprint, the step, sample uid, sample and SFT step counters and
  AdamW's step count equal; the two SFT accuracies equal (bit for bit);
- the parameters and AdamW moments: each array's largest difference within TOL of its largest
  element (TOL 0: bit for bit);
- the metric history: the same rows and keys in the same order, every value but the timings
  within MREL relative, differences below MABS counted as none (defaults: TOL and 0; TOL 0: bit
  for bit).
Exits non-zero naming what differs."""
import math
import struct
import sys


class reader:
    def __init__(self, path):
        self.path, self.b, self.o = path, open(path, "rb").read(), 0

    def take(self, fmt):
        n = struct.calcsize(fmt)
        assert self.o + n <= len(self.b), f"{self.path}: truncated"
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += n
        return v

    def one(self, fmt):
        return self.take(fmt)[0]

    def string(self):
        n = self.one("<Q")
        assert self.o + n <= len(self.b), f"{self.path}: truncated"
        self.o += n
        return self.b[self.o - n : self.o].decode()


def load(path):
    r = reader(path)
    assert r.b[:8] == b"WEFTRL02", f"{path}: not a weft RL checkpoint"
    r.o = 8
    head = {"fingerprint": r.string()}
    for k, f in (("steps", "<q"), ("uid", "<Q"), ("samples", "<d"), ("sft steps", "<q"),
                 ("sft sampled accuracy", "<d"), ("sft greedy accuracy", "<d")):
        head[k] = r.one(f)
    arrays = []
    for _ in range(3):  # parameters, first and second moments
        n = r.one("<Q")
        assert r.o + 8 * n <= len(r.b), f"{path}: truncated (f64 checkpoints only)"
        arrays.append(r.take(f"<{n}d"))
    head["adam steps"] = r.one("<q")
    history = []
    for _ in range(r.one("<Q")):
        history.append([(r.string(), r.one("<d")) for _ in range(r.one("<Q"))])
    assert r.o == len(r.b), f"{path}: {len(r.b) - r.o} bytes after the metric history"
    return head, arrays, history


def bits(x):
    return struct.pack("<d", x)


a_path, b_path, what, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
mrel = float(sys.argv[5]) if len(sys.argv) > 5 else tol
mabs = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
(ha, xa, ma), (hb, xb, mb) = load(a_path), load(b_path)
for k in ha:  # counters and accuracies exactly (a resume copies them, a run recounts them)
    same = bits(ha[k]) == bits(hb[k]) if isinstance(ha[k], float) else ha[k] == hb[k]
    assert same, f"{what}: header {k}: {ha[k]!r} against {hb[k]!r}"
for name, x, y in zip(("parameters", "m", "v"), xa, xb):
    assert len(x) == len(y) and len(x) > 0, f"{what}: {name} sizes {len(x)}, {len(y)}"
    scale = max(abs(t) for t in x)
    if tol == 0:
        diff = sum(1 for p, q in zip(x, y) if bits(p) != bits(q))
        print(f"{what}: {name} ({len(x)}): {diff} elements differ in their bits")
        assert diff == 0, f"{what}: {name}: {diff} elements differ"
        continue
    d = max(abs(p - q) for p, q in zip(x, y)) / scale
    print(f"{what}: {name} ({len(x)}) within {d:.1e} of the largest, {scale:.2e}")
    assert scale > 0 and d <= tol, f"{what}: {name} differ by {d:.2e} > {tol}"
assert len(ma) == len(mb), f"{what}: metric history of {len(ma)} and {len(mb)} steps"
worst, values = 0.0, 0
for step, (ra, rb) in enumerate(zip(ma, mb), 1):
    keys = [k for k, _ in ra]
    assert keys == [k for k, _ in rb], f"{what}: step {step}'s metric keys differ"
    for (k, x), (_, y) in zip(ra, rb):
        if k.startswith("timing_s/"):
            continue
        values += 1
        if mrel == 0:
            assert bits(x) == bits(y), f"{what}: step {step} {k}: {x!r} against {y!r}"
            continue
        if math.isnan(x) or math.isnan(y):  # NaN equals only NaN
            assert math.isnan(x) and math.isnan(y), f"{what}: step {step} {k}: {x} against {y}"
            continue
        d = abs(x - y) / max(abs(x), abs(y)) if abs(x - y) > mabs else 0.0
        worst = max(worst, d)
        assert d <= mrel, f"{what}: step {step} {k}: {x!r} against {y!r}"
print(f"{what}: header equal; metric history ({len(ma)} steps, {values} values) "
      + ("bit for bit" if mrel == 0 else f"within {worst:.1e} relative"))
