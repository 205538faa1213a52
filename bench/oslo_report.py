#!/usr/bin/env python3
"""The report of bench/oslo-table1.sh: its table1.csv as seed 002's Table 1, with ratios against
issue 31's goals. Usage: oslo_report.py table1.csv > report.md"""
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
import statistics
runs = {}
for r in rows:
    runs.setdefault((r["config"], r["op"]), []).append(float(r["seconds"]))
t = {k: statistics.median(v) for k, v in runs.items()}  # P4 runs three times: the median
files = next((r["files"] for r in rows if r["op"] != "sha256"), rows[0]["files"])
ops = ["untar", "md5-each", "md5-batch", "rm"]
cfgs = ["local", "shared", "image-fuse2fs", "image-kernel", "pool-squashfuse", "pool-squashfs", "pool-erofs"]
print(f"# Seed 002 Table 1 on the testbed ({files} files)\n")
print("| step | " + " | ".join(cfgs) + " |")
print("|---|" + "---:|" * len(cfgs))
for op in ops:
    print(f"| {op} | " + " | ".join(f"{t[(c, op)]:.2f}" if (c, op) in t else "—" for c in cfgs) + " |")
print("\n## Ratios\n")
print("| step | image-kernel ÷ local (goal ≤ 1.1) | image-kernel ÷ shared (goal ≤ 0.1) | image-fuse2fs ÷ local | pool-erofs ÷ local | pool-squashfs ÷ local | pool-squashfuse ÷ local |")
print("|---|---:|---:|---:|---:|---:|---:|")
def r(a, b, op):
    return f"{t[(a, op)] / t[(b, op)]:.2f}" if (a, op) in t and (b, op) in t and t[(b, op)] > 0 else "—"
for op in ops:
    print(f"| {op} | {r('image-kernel','local',op)} | {r('image-kernel','shared',op)} | {r('image-fuse2fs','local',op)} | {r('pool-erofs','local',op)} | {r('pool-squashfs','local',op)} | {r('pool-squashfuse','local',op)} |")
for k in ("p4-kernel-squashfs", "p4-kernel-erofs"):
    if ("p4-local", "sha256") in t and (k, "sha256") in t:
        print(f"\nP4: sha256sum of 1 GiB through the helper's {k[10:]} mount of a pool {t[(k,'sha256')]:.2f} s ÷ the file on local disk {t[('p4-local','sha256')]:.2f} s = "
              f"{t[(k,'sha256')] / t[('p4-local','sha256')]:.3f} (goal ≤ 1.05; medians of {len(runs[(k, 'sha256')])} cold runs)")
