#!/usr/bin/env python3
"""checkpoint_close.py A.bin B.bin WHAT TOL: two rl_trainer checkpoints (model.bin of an --f64
run) hold the same parameters and AdamW moments: each array's largest difference within TOL of
its largest element (TOL 0: bit for bit). Exits non-zero naming the array that differs."""
import struct
import sys


def load(path):
    b = open(path, "rb").read()
    assert b[:8] == b"WEFTRL02", f"{path}: not a weft RL checkpoint"
    o = 16 + struct.unpack_from("<Q", b, 8)[0]  # magic, the flags
    o += 6 * 8  # steps, uid, samples, SFT steps, two accuracies
    out = []
    for _ in range(3):  # parameters, first and second moments
        n = struct.unpack_from("<Q", b, o)[0]
        assert o + 8 + 8 * n <= len(b), f"{path}: truncated (f64 checkpoints only)"
        out.append(struct.unpack_from(f"<{n}d", b, o + 8))
        o += 8 + 8 * n
    return out


a_path, b_path, what, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
for name, x, y in zip(("parameters", "m", "v"), load(a_path), load(b_path)):
    assert len(x) == len(y) and len(x) > 0, f"{what}: {name} sizes {len(x)}, {len(y)}"
    scale = max(abs(t) for t in x)
    if tol == 0:
        diff = sum(1 for p, q in zip(x, y) if struct.pack("<d", p) != struct.pack("<d", q))
        print(f"{what}: {name} ({len(x)}): {diff} elements differ in their bits")
        assert diff == 0, f"{what}: {name}: {diff} elements differ"
        continue
    d = max(abs(p - q) for p, q in zip(x, y)) / scale
    print(f"{what}: {name} ({len(x)}) within {d:.1e} of the largest, {scale:.2e}")
    assert scale > 0 and d <= tol, f"{what}: {name} differ by {d:.2e} > {tol}"
