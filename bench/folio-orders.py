#!/usr/bin/env python3
"""How the page cache holds a file (not a test; root: /proc/kpageflags): the first MIB MiB
(default 64) of each FILE are mapped, every page touched, and each page's frame looked up in
/proc/self/pagemap and /proc/kpageflags. Prints, per file, the pages held in large folios
(compound heads and tails) and in single pages (order 0).

    sudo bench/folio-orders.py [--mib MIB] FILE...

Why: a warm read of a file costs per folio; on kernel 6.18 a file on ext4 is cached in large
folios and a file read through FUSE in single pages (bench/README.md, "warm reads")."""
import argparse
import ctypes
import os
import struct

KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL = 15, 16
PAGE = os.sysconf("SC_PAGE_SIZE")


def orders(path, mib):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = min(os.fstat(fd).st_size, mib << 20) // PAGE * PAGE
        if size == 0:
            return 0, 0, 0
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        view = (ctypes.c_char * size).from_address(addr)
        for off in range(0, size, PAGE):
            view[off]  # fault the page in
        heads = tails = single = 0
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            for i in range(size // PAGE):
                pm.seek((addr // PAGE + i) * 8)
                entry = struct.unpack("<Q", pm.read(8))[0]
                if not entry >> 63 & 1:
                    continue
                kf.seek((entry & ((1 << 55) - 1)) * 8)
                flags = struct.unpack("<Q", kf.read(8))[0]
                if flags >> KPF_COMPOUND_HEAD & 1:
                    heads += 1
                elif flags >> KPF_COMPOUND_TAIL & 1:
                    tails += 1
                else:
                    single += 1
        return heads, tails, single
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    for f in a.files:
        h, t, s = orders(f, a.mib)
        print(f"{f}: {h} large folios holding {h + t} pages, {s} single pages")


if __name__ == "__main__":
    main()
