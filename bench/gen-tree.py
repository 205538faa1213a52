#!/usr/bin/env python3
"""Generate a deterministic tree shaped like a source tree: N files in nested directories with a
long-tailed size distribution (many small files, a few large ones), random (incompressible) content
mixed with text-like (compressible) content.

usage: gen-tree.py DIR [--files N] [--seed S]
"""
import argparse, os, random

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--files", type=int, default=50000)
ap.add_argument("--seed", type=int, default=1)
a = ap.parse_args()
rng = random.Random(a.seed)
words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, 12))) for _ in range(2000)]
total = 0
ndirs = max(1, a.files // 60)
dirs = []
for i in range(ndirs):
    depth = rng.randint(1, 4)
    d = os.path.join(a.dir, *[f"d{rng.randint(0, 20)}" for _ in range(depth - 1)], f"dir{i}")
    os.makedirs(d, exist_ok=True)
    dirs.append(d)
for i in range(a.files):
    size = min(int(rng.lognormvariate(8.3, 1.3)), 4 << 20)  # median ~4 KB, long tail
    d = dirs[i % ndirs]
    p = os.path.join(d, f"f{i}.{rng.choice(['c', 'h', 'py', 'txt', 'o'])}")
    if rng.random() < 0.7:  # text-like
        buf = bytearray()
        while len(buf) < size:
            buf += rng.choice(words) + b" "
        data = bytes(buf[:size])
    else:
        data = rng.randbytes(size)
    with open(p, "wb") as f:
        f.write(data)
    total += size
    os.utime(p, (1700000000, 1700000000))
print(f"{a.files} files, {ndirs} directories, {total / 1e6:.1f} MB in {a.dir}")
