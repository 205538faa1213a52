#!/usr/bin/env python3
"""bench/storm_report.py OUTDIR: report.md + plots from bench/storm.sh's runs.jsonl."""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1]
runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl")) if l.strip()]
params = json.load(open(os.path.join(out, "params.json")))
names = {"a": "(a) shared storage", "b": "(b) bundled pool, sw-pool load", "c": "(c) pool mounted from shared storage",
         "v": "(v) unprepared tree, sw-pool run --cache (view per node)",
         "s": "(s) shared storage, launched by srun",
         "j": "(j) unprepared tree, sw-pool run --cache under srun (job-wide view)"}
ways = [w for w in "abcvsj" if any(r["way"] == w for r in runs)]


def key(r):
    return (r["nodes"] * r["ppn"], r["nodes"])


def get(way):
    return sorted([r for r in runs if r["way"] == way], key=key)


figs = []
for metric, label, fname, logy in [
    ("slowest_s", "time to end of import, slowest rank [s]", "time.png", True),
    ("server_requests", "requests served by the storage server (its log)", "ops.png", True),
    ("server_syscalls", "storage server read+write syscalls (incl. socket I/O)", "syscalls.png", True),
    ("bytes", "bytes sent by the storage server", "bytes.png", True),
]:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for w in ways:
        rs = [r for r in get(w) if r.get(metric) is not None]
        xs = [f'{r["nodes"]}x{r["ppn"]}' for r in rs]
        ax.plot(xs, [max(r[metric], 1e-3) for r in rs], marker="o", label=names[w])
    ax.set_xlabel("nodes x ranks per node")
    ax.set_ylabel(label)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plt.xticks(rotation=45)
    fig.tight_layout()
    fig.savefig(os.path.join(out, fname), dpi=110)
    figs.append((label, fname))

lines = [f"# Loading storm: shared storage vs bundled pool\n",
         f"Command: `{params['command']}` (STORM_LATENCY={params['latency']}, STORM_MDS_DELAY_US={params.get('mds_delay_us', 0)}, STORM_PYPI=\"{params['pypi']}\"), "
         f"{params['duration_s']} s in all (machine load average {params.get('loadavg_start', '?')} at the start, "
         f"{params.get('loadavg_end', '?')} at the end: 2 cores shared with other work, single runs). Generated package: M = {params['M']} extension modules x F = {params['F']} "
         f"functions, each module linked to its own library, + PyPI `{params['pypi']}`; {params['files']} files; "
         f"bundled pool {params['pool_bytes'] / 1e6:.1f} MB (squashfs). Storage link: netem delay {params['latency']} "
         f"under the testbed's tbf cap; metadata delay on the server: {params.get('mds_delay_us', 0)} us per metadata syscall "
         f"(strace -e inject=%file,getdents64:delay_enter, attached to the sftp sessions during the timed runs; 0 = none). Server operations: the requests the storage server served (open, lstat, opendir, readdir, "
         f"read, close ...), counted in its own log (OpenSSH sftp-server at DEBUG3: one `request N: OP` line per request; "
         f"testbed/storage-ops), all and the metadata requests among them (all but reads); also the read + write system calls of "
         f"every process in the server's namespace (/proc/PID/io), which include the ssh transport's socket I/O.\n",
         "| N x P | way | slowest rank [s] | slowest import only [s] | load/mount [s] | server requests | of them metadata | server syscalls | bytes served |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in sorted(runs, key=lambda r: (key(r), r["way"])):
    ok = "" if r["ok_ranks"] == r["ranks"] else f" ({r['ok_ranks']}/{r['ranks']} ranks!)"
    lines.append(f"| {r['nodes']}x{r['ppn']} | {r['way']}{ok} | {r['slowest_s']} | {r['slowest_import_s']} | "
                 f"{r['load_s'] if r['load_s'] is not None else '-'} | {r.get('server_requests', 0):,} | "
                 f"{r.get('server_requests', 0) - r.get('server_reads', 0):,} | {r['server_syscalls']:,} | {r['bytes']:,} |")
lines.append("")


def ratio(vals):
    vals = [v for v in vals if v]
    return max(vals) / min(vals) if vals else float("nan")


# the goal on requests max / min: the bundled pool's (<= 1.1) and the views' (<= 1.2, issue 55);
# the others are what they are compared with
flat_goal = {"b": "goal <= 1.1", "v": "goal <= 1.2", "j": "goal <= 1.2"}
goals = []
for w in ways:
    rs = get(w)
    goals.append(f"- {names[w]}: server requests max / min over {len(rs)} configurations = "
                 f"{ratio([r.get('server_requests') for r in rs]):.2f} ({flat_goal.get(w, 'no goal: a baseline')}; metadata requests "
                 f"{min(r.get('server_requests', 0) - r.get('server_reads', 0) for r in rs):,} .. "
                 f"{max(r.get('server_requests', 0) - r.get('server_reads', 0) for r in rs):,}); bytes max / min = "
                 f"{ratio([r['bytes'] for r in rs]):.2f}; server syscalls max / min = {ratio([r['server_syscalls'] for r in rs]):.2f}")
a = {(r["nodes"], r["ppn"]): r for r in get("a")}
b = {(r["nodes"], r["ppn"]): r for r in get("b")}
c = {(r["nodes"], r["ppn"]): r for r in get("c")}
big = max(a.keys() & b.keys(), default=None, key=lambda k: k[0] * k[1])
if big:
    goals.append(f"- at {big[0]} x {big[1]}: (a) {a[big]['slowest_s']} s, (b) {b[big]['slowest_s']} s -> "
                 f"(a) / (b) = {a[big]['slowest_s'] / b[big]['slowest_s']:.2f} (goal >= 5)"
                 + (f"; (c) {c[big]['slowest_s']} s" if big in c else ""))
v = {(r["nodes"], r["ppn"]): r for r in get("v")}
if big and big in v:
    goals.append(f"- (v) at {big[0]} x {big[1]}: {v[big]['slowest_s']} s -> (a) / (v) = "
                 f"{a[big]['slowest_s'] / v[big]['slowest_s']:.2f} (goal >= 5), (v) / (b) = "
                 f"{v[big]['slowest_s'] / b[big]['slowest_s']:.2f} (goal <= 1.2)")
j = {(r["nodes"], r["ppn"]): r for r in get("j")}
sh = {(r["nodes"], r["ppn"]): r for r in get("s")}
if big and big in j:
    goals.append(f"- (j) at {big[0]} x {big[1]}: {j[big]['slowest_s']} s -> (a) / (j) = "
                 f"{a[big]['slowest_s'] / j[big]['slowest_s']:.2f}"
                 + (f", (s) / (j) = {sh[big]['slowest_s'] / j[big]['slowest_s']:.2f}" if big in sh else "")
                 + f" (goal >= 5), (j) / (b) = {j[big]['slowest_s'] / b[big]['slowest_s']:.2f} (goal <= 1.2)")
if j:
    one = j.get((1, 1)) or min(j.values(), key=lambda r: r["nodes"] * r["ppn"])
    goals.append(f"- (j) storage bytes max / min = {ratio([r['bytes'] for r in j.values()]):.2f} "
                 f"(goal: not x N; each file read once per job: {min(r['bytes'] for r in j.values()):,} .. "
                 f"{max(r['bytes'] for r in j.values()):,} bytes; one node on its own ({one['nodes']} x {one['ppn']}) "
                 f"{one['bytes']:,}); requests max / min = {ratio([r['server_requests'] for r in j.values()]):.2f} (goal <= 1.2)")
lines += ["## Goals", ""] + goals + [""]
for label, f in figs:
    lines += [f"![{label}]({f})", ""]
lm = os.path.join(out, "linkmodes.txt")
if os.path.exists(lm):
    lines += ["## Link modes (node1, pool mounted from a local copy, warm)", "",
              "`storm` = `--link needed` (DT_NEEDED = $ORIGIN/... paths), `stormrp` = `--link runpath`. "
              "strace -c -f -e trace=%file of one import: total file syscalls and failed ones.", "", "```"]
    lines += [l.rstrip() for l in open(lm)] + ["```", ""]
st = sorted(glob.glob(os.path.join(out, "strace-*.txt")))
if st:
    lines += ["## Server-side strace -c -f (separate pass; its times are not used)", ""]
    for f in st:
        txt = open(f).read().strip().splitlines()
        tot = [l for l in txt if l.strip().endswith("total")]
        keep = [l for l in txt if any(s in l for s in ("openat", "stat", "getdents", "lstat", "read", "total", "calls"))]
        lines += [f"`{os.path.basename(f)}`:", "", "```"] + keep[:14] + ["```", ""]
open(os.path.join(out, "report.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:60]))
