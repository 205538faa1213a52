#!/usr/bin/env python3
"""The two sides of the root-mount races (t_46, t_47), so that both tests race the same way.

  race.py swap A B STOP
      exchange the paths A and B (renameat2 RENAME_EXCHANGE) as fast as it can until the file STOP
      exists; prints how many exchanges succeeded.
  race.py watch STOP TAG INSIDE [DECOY]
      read /proc/self/mountinfo until STOP exists; every mount whose path contains TAG is counted as
      inside (its path starts with INSIDE) or outside; with DECOY, any entry other than `mnt` that
      appears in that directory counts as outside too. Prints: reads, sightings inside, the number
      of places outside, and those places.
"""
import ctypes
import os
import sys


def swap(a, b, stop):
    libc = ctypes.CDLL(None, use_errno=True)
    a, b, n = a.encode(), b.encode(), 0
    while not os.path.exists(stop):
        for _ in range(200):
            if libc.renameat2(-100, a, -100, b, 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
                n += 1
    print(n)


def watch(stop, tag, inside, decoy=None):
    samples, seen_inside, outside = 0, 0, set()
    while not os.path.exists(stop):
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split(" ")[4].replace("\\040", " ")
                if tag not in mp:
                    continue
                if mp.startswith(inside):
                    seen_inside += 1
                else:
                    outside.add(mp)
        if decoy:
            outside |= {os.path.join(decoy, e) for e in os.listdir(decoy) if e != "mnt"}
        samples += 1
    print(samples, seen_inside, len(outside), " ".join(sorted(outside)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["swap"] and len(sys.argv) == 5:
        swap(*sys.argv[2:5])
    elif sys.argv[1:2] == ["watch"] and len(sys.argv) in (5, 6):
        watch(*sys.argv[2:])
    else:
        sys.exit(__doc__)
