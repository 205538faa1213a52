#!/usr/bin/env python3
"""Turn one bench/run result directory (results.jsonl + meta.json) into results.csv, PNG plots and
report.md. Only what bench/run measured is used; a configuration with no successful run is reported
as missing, never filled in.

usage: report.py RESULT_DIR
"""
import csv, json, os, re, statistics, sys
from collections import defaultdict

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = sys.argv[1]
meta = json.load(open(os.path.join(OUT, "meta.json")))
runs = [json.loads(l) for l in open(os.path.join(OUT, "results.jsonl")) if l.strip()]
S = meta["data_bytes"]
NS = meta["node_counts"]
TB = meta["testbed"]

METHODS = {  # fig11 method -> label
    "shared": "read from shared storage on every node",
    "copy": "every node copies to local disk, then hashes",
    "sbcast": "Slurm sbcast to local disk, then hash",
    "direct-mount": "pool mounted from shared storage (squashfuse_ll, Apptainer-style)",
    "swpool-cp": "sw-pool cp + squashfuse_ll (local)",
    "swpool-load-sqfs": "sw-pool load (default format, squashfs)",
    "swpool-load-ext2": "sw-pool load (ext2, the paper's format)",
}
COLORS = {"shared": "tab:gray", "copy": "tab:orange", "sbcast": "tab:red", "direct-mount": "tab:purple",
          "swpool-cp": "tab:cyan", "swpool-load-sqfs": "tab:blue", "swpool-load-ext2": "tab:green"}
SWPOOL_METHODS = ("swpool-load-sqfs", "swpool-load-ext2")


def rate_bps(r):
    """'400mbit' -> bytes/s; 'none' -> None"""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)?", str(r).lower())
    if not m:
        return None
    v = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return v / 8 if (m.group(3) or "bit") == "bit" else v


NODE_BPS, STOR_BPS = rate_bps(TB["node_rate"]), rate_bps(TB["storage_rate"])
caps = [c for c in (NODE_BPS, STOR_BPS) if c]
WIRE_BPS = min(caps) if caps else None


def key(r):
    return (r["section"], r["method"], r["n"], r.get("op", ""), r.get("temp", ""))


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import labels  # noqa: E402

groups = defaultdict(list)
failed = defaultdict(int)
# runs whose storage bytes contradict their label (a "first load" that found the pool cached):
# no figure is computed from them; they are listed in the report
mislabelled = []
for r in runs:
    why = labels.check(r, S)
    if why:
        mislabelled.append(why)
    elif r.get("ok", True) and not r.get("errors"):
        groups[key(r)].append(r)
    else:
        failed[key(r)] += 1


def stat(rs, f=lambda r: r["seconds"]):
    v = sorted(f(r) for r in rs)
    if not v:
        return None
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v)}


def get(section, method, n, op="", temp="", f=lambda r: r["seconds"]):
    return stat(groups.get((section, method, n, op, temp), []), f)


def phase_of(name):
    return lambda r: r["phases"].get(name, 0.0)


def fmt(x, d=2):
    return "–" if x is None else f"{x:.{d}f}"


def cell(s, d=2):
    if not s:
        return "–"
    few = f" [{s['n']} of {meta['reps']} runs]" if s["n"] < meta["reps"] else ""
    if s["n"] == 1:
        return f"{s['median']:.{d}f}{few}"
    return f"{s['median']:.{d}f} ({s['min']:.{d}f}–{s['max']:.{d}f}){few}"


def mb(b):
    return f"{b / 1e6:,.0f} MB"


# ------------------------------------------------------------------ CSV
cols = ["section", "method", "n", "op", "temp", "rep", "seconds", "storage_bytes", "data_bytes", "ok", "phases", "swpool_phases"]
with open(os.path.join(OUT, "results.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in runs:
        w.writerow([r.get("section"), r.get("method"), r.get("n"), r.get("op", ""), r.get("temp", ""), r.get("rep"),
                    r.get("seconds"), r.get("storage_bytes"), r.get("data_bytes", ""), r.get("ok", True),
                    json.dumps(r.get("phases", {})), json.dumps((r.get("swpool") or {}).get("phases", {}))])

# ------------------------------------------------------------------ plots
plt.rcParams.update({"font.size": 10, "figure.dpi": 110})
present = [m for m in METHODS if any(groups.get(("fig11", m, n, "", "")) for n in NS)]
plots = []

if present:
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for m in present:
        xs, ys, lo, hi = [], [], [], []
        for n in NS:
            s = get("fig11", m, n)
            if s:
                xs.append(n); ys.append(s["median"]); lo.append(s["median"] - s["min"]); hi.append(s["max"] - s["median"])
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label=METHODS[m], color=COLORS[m])
    if WIRE_BPS:
        ax.plot(NS, [S / WIRE_BPS] * len(NS), "k--", lw=1, label=f"wire limit S ÷ slowest cap ({S / WIRE_BPS:.1f} s)")
    if STOR_BPS:
        ax.plot(NS, [max(n * S / STOR_BPS, S / WIRE_BPS if WIRE_BPS else 0) for n in NS], "k:", lw=1,
                label="storage limit when every node reads (N·S ÷ storage cap)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(NS); ax.set_xticklabels([str(n) for n in NS])
    ax.set_xlabel("nodes N"); ax.set_ylabel("seconds (median, bars: min–max)")
    ax.set_title(f"Figure 11: {S / 1e6:,.0f} MB random file to N nodes, then sha256sum on every node")
    ax.set_ylim(bottom=0); ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "fig11_time_vs_nodes.png")); plt.close(fig)
    plots.append("fig11_time_vs_nodes.png")

    # storage bytes vs nodes
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    marks = "osD^vP*"
    for i, m in enumerate(present):
        xs, ys = [], []
        off = 1 + 0.025 * (i - (len(present) - 1) / 2)   # methods with equal values stay visible side by side
        for n in NS:
            s = get("fig11", m, n, f=lambda r: r["storage_bytes"] / S)
            if s:
                xs.append(n * off); ys.append(s["median"])
        ax.plot(xs, ys, marker=marks[i % len(marks)], ms=7, lw=1.5, alpha=0.85, label=METHODS[m], color=COLORS[m])
    ax.set_xscale("log", base=2); ax.set_xticks(NS); ax.set_xticklabels([str(n) for n in NS])
    ax.set_xlabel("nodes N"); ax.set_ylabel("bytes served by storage ÷ file size\n(equal values drawn side by side)")
    ax.set_title("Shared-storage load: bytes the storage server sent per run")
    ax.set_ylim(bottom=0); ax.grid(alpha=0.3); ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "storage_bytes_vs_nodes.png")); plt.close(fig)
    plots.append("storage_bytes_vs_nodes.png")

    # Figure 12: where the time goes (median of each phase, slowest node)
    PH_ORDER = ["copy", "sbcast", "cp", "load", "mount", "readhash", "hash", "umount"]
    PH_LABEL = {"readhash": "read from shared storage + hash", "copy": "copy to local disk", "sbcast": "sbcast to local disk",
                "cp": "sw-pool cp", "load": "sw-pool load", "mount": "FUSE mount", "hash": "sha256sum (local)", "umount": "unmount",
                "swtotal": "sw-pool's own total (--json)", "launch": "mpirun: starting the ranks, exit"}
    PH_COL = {"swtotal": "tab:blue", "launch": "#c6dbef", "readhash": "tab:gray", "copy": "tab:orange", "sbcast": "tab:red", "cp": "tab:cyan", "load": "tab:blue", "mount": "tab:purple",
              "hash": "tab:olive", "umount": "tab:brown", "preflight": "#cccccc", "read": "#9ecae1",
              "distribute": "#3182bd", "write": "#fdae6b", "verify": "#a1d99b", "commit": "#636363"}
    fig, ax = plt.subplots(figsize=(10, 5))
    bars, labels, xpos, top = [], [], 0, 0.0
    seen = set()
    ticks, ticklabels = [], []
    for n in NS:
        for m in present:
            rs = groups.get(("fig11", m, n, "", ""), [])
            if not rs:
                continue
            segs = []
            sw = [r["swpool"]["phases"] for r in rs if r.get("swpool")]
            if sw:
                # sw-pool's own total (--json), then what the mpirun around it added (launching the ranks
                # on the nodes, exit), then the harness's mount and hash
                tot = [x.get("total") for x in sw if x.get("total") is not None]
                step = "load" if m.startswith("swpool-load") else "cp"
                if tot:
                    segs.append(("swtotal", statistics.median(tot)))
                    wall = [r["phases"][step] - r["swpool"]["phases"]["total"] for r in rs
                            if step in r["phases"] and r.get("swpool") and "total" in r["swpool"]["phases"]]
                    if wall:
                        segs.append(("launch", max(0.0, statistics.median(wall))))
                for p in ("mount", "hash"):
                    v = [r["phases"].get(p) for r in rs if p in r["phases"]]
                    if v and not (p == "mount" and any("mount" in x for x in sw)):
                        segs.append((p, statistics.median(v)))
            else:
                for p in PH_ORDER:
                    v = [r["phases"].get(p) for r in rs if p in r["phases"]]
                    if v:
                        segs.append((p, statistics.median(v)))
            bottom = 0
            for p, v in segs:
                ax.bar(xpos, v, bottom=bottom, color=PH_COL.get(p, "k"), edgecolor="white", width=0.8,
                       label=PH_LABEL.get(p, p) if p not in seen else None)
                seen.add(p); bottom += v
            top = max(top, bottom)
            ticks.append(xpos); ticklabels.append(f"{m}\nN={n}")
            xpos += 1
        xpos += 0.6
    ax.set_xticks(ticks); ax.set_xticklabels(ticklabels, rotation=90, fontsize=7)
    ax.set_ylabel("seconds (median per phase, slowest node)")
    ax.set_title("Figure 12: where the time goes, per method and N")
    ax.set_ylim(0, top * 1.45 if top else 1)
    ax.legend(fontsize=8, ncol=2, loc="upper left"); ax.grid(alpha=0.3, axis="y")
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "fig12_phases.png")); plt.close(fig)
    plots.append("fig12_phases.png")

# small files
SF_WHERE = [("local", "node-local disk"), ("shared", "shared storage (sshfs)"), ("pool", "squashfs pool on shared storage")]
SF_OPS = ["untar", "md5sum", "rm"]
if any(k[0] == "smallfiles" for k in groups):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    for i, (w, lab) in enumerate(SF_WHERE):
        xs, ys, err = [], [], [[], []]
        for j, op in enumerate(SF_OPS):
            s = get("smallfiles", w, 1, op)
            if s:
                xs.append(j + (i - 1) * width); ys.append(s["median"])
                err[0].append(s["median"] - s["min"]); err[1].append(s["max"] - s["median"])
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=lab)
        for x, y, e in zip(xs, ys, err[1]):
            ax.text(x, (y + e) * 1.08, f"{y:.2f}" if y < 10 else f"{y:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(SF_OPS))); ax.set_xticklabels(["untar (tar -xf)", "md5sum every file", "rm -rf"])
    ax.set_yscale("log"); ax.set_ylabel("seconds (log scale, median)")
    t = meta.get("tree", {})
    ax.set_title(f"Oslo disk-image study, Table 1: {t.get('files')} small files, {(t.get('bytes') or 0) / 1e6:.0f} MB (pool: read-only, md5sum only)", fontsize=9)
    ax.legend(fontsize=8); ax.grid(alpha=0.3, axis="y")
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "smallfiles.png")); plt.close(fig)
    plots.append("smallfiles.png")

# P4
P4_KINDS = [("native", "native (local disk)"), ("squashfuse_ll", "squashfuse_ll (squashfs pool)"), ("fuse2fs", "fuse2fs (ext2 pool)")]
if any(k[0] == "p4" for k in groups):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    combos = [(op, t) for op in ("hash", "read") for t in ("cold", "warm")]
    width = 0.27
    for i, (kind, lab) in enumerate(P4_KINDS):
        xs, ys = [], []
        for j, (op, t) in enumerate(combos):
            s = get("p4", kind, 1, op, t, f=phase_of("op"))
            if s:
                xs.append(j + (i - 1) * width); ys.append(s["median"])
        ax.bar(xs, ys, width, label=lab)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(combos))); ax.set_xticklabels([f"sha256sum, {t}" if op == "hash" else f"read (cat), {t}" for op, t in combos])
    ax.set_ylabel("seconds (median)"); ax.set_title(f"P4: reading the {S / 1e6:,.0f} MB file natively vs through the mount (node-local image)")
    ax.legend(fontsize=8); ax.grid(alpha=0.3, axis="y")
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "p4_mount_overhead.png")); plt.close(fig)
    plots.append("p4_mount_overhead.png")

# sparse
SP_METHODS = [("copy-dense", "cp, dense file"), ("copy-sparse", "cp --sparse=always, sparse pool"),
              ("swpool-cp-dense", "sw-pool cp, dense file"), ("swpool-cp-sparse", "sw-pool cp, sparse pool")]
sp = meta.get("sparse", {})
if any(k[0] == "sparse" for k in groups):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    labs, ts, bs = [], [], []
    for m, lab in SP_METHODS:
        s = get("sparse", m, sp["n"])
        b = get("sparse", m, sp["n"], f=lambda r: r["storage_bytes"] / 1e6)
        if s:
            labs.append(lab); ts.append(s["median"]); bs.append(b["median"])
    a1.bar(labs, ts, color="tab:blue"); a1.set_ylabel("seconds (median)"); a1.set_title(f"copy to {sp['n']} nodes")
    a2.bar(labs, bs, color="tab:orange"); a2.set_ylabel("MB served by storage"); a2.set_title("storage load")
    for a in (a1, a2):
        a.tick_params(axis="x", labelrotation=20, labelsize=8); a.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Sparse pool: {sp['image_bytes'] / 1e6:,.0f} MB ext4 image holding {sp['data_bytes'] / 1e6:,.0f} MB vs the dense file", fontsize=10)
    fig.tight_layout(); fig.savefig(os.path.join(OUT, "sparse.png")); plt.close(fig)
    plots.append("sparse.png")

# ------------------------------------------------------------------ goals
NA = "not measurable in this build"
goals = []
has_load, has_cp = meta["swpool"]["has_load"], meta["swpool"]["has_cp"]
maxn = max(NS)

def have(section):
    return any(r["section"] == section for r in runs)


def not_run(section):
    """(measured, verdict) for a goal whose section has no successful run"""
    if section not in meta["sections"]:
        return "section not run (BENCH_SECTIONS)", "not run"
    if not meta.get("complete", True) and not any(r["section"] == section for r in runs):
        return "not measured: the run was interrupted before this section", "not measured"
    return f"{section} section failed", "MISSED"


def missing_section(section):
    L.append(f"**{not_run(section)[0][0].upper() + not_run(section)[0][1:]}.**\n")


# the sw-pool distribution figure: load (if present) else cp; time of the distribution step only
dist_method, dist_phase = (("swpool-load-sqfs", "load") if has_load else ("swpool-cp", "cp") if has_cp else (None, None))
if not have("fig11") and ("fig11" not in meta["sections"] or not meta.get("complete", True)):
    dist_method = "skip"
goals.append(("P0", "every run is what it is labelled (first runs read the data from storage, repeats ~nothing)",
              "all runs" if not mislabelled else f"{len(mislabelled)} run(s) excluded from every figure: " + "; ".join(mislabelled[:3]),
              "pass" if not mislabelled else "MISSED"))
if dist_method == "skip":
    for g, c in (("P1", "sw-pool time ÷ wire limit ≤ 1.3, flat in N"), ("P2", "storage bytes ÷ data = 1.00 (first), ~0 (repeat)"),
                 ("P3", "sw-pool ÷ sbcast ≤ 0.5 at N = 8")):
        goals.append((g, c, *not_run("fig11")))
elif dist_method and WIRE_BPS:
    ratios, own = {}, {}
    for n in NS:
        s = get("fig11", dist_method, n, f=phase_of(dist_phase))
        if s:
            ratios[n] = s["median"] / (S / WIRE_BPS)
        o = stat([r for r in groups.get(("fig11", dist_method, n, "", ""), []) if r.get("swpool")], f=lambda r: r["swpool"]["phases"].get("total", 0.0))
        if o:
            own[n] = o["median"] / (S / WIRE_BPS)
    if ratios:
        flat = max(ratios.values()) / min(ratios.values())
        ok = all(v <= 1.3 for v in ratios.values()) and flat <= 1.2
        goals.append(("P1", f"`{dist_method}` ({dist_phase} step) time ÷ wire limit ≤ 1.3 and flat in N (max÷min ≤ 1.2)",
                      ", ".join(f"N={n}: {v:.2f}" for n, v in ratios.items()) + f"; max÷min {flat:.2f}" +
                      ("; sw-pool's own --json total ÷ limit (without mpirun's start): " + ", ".join(f"N={n}: {v:.2f}" for n, v in own.items()) if own else ""),
                      "pass" if ok else "MISSED"))
    else:
        goals.append(("P1", "sw-pool time ÷ wire limit ≤ 1.3, flat in N", "no successful run", "MISSED"))
else:
    goals.append(("P1", "sw-pool time ÷ wire limit ≤ 1.3, flat in N", "needs `sw-pool load` or `sw-pool cp`" if not dist_method else "node/storage caps unknown", NA))

if dist_method == "skip":
    pass
elif dist_method:
    pool_bytes = meta.get("pool_sqfs_bytes")
    if not pool_bytes:  # not recorded: the size sw-pool itself reported for the pool it copied
        tot = [r["swpool"].get("bytes_total") for r in runs if r.get("method") == dist_method and r.get("swpool", {}).get("bytes_total")]
        pool_bytes = statistics.median(tot) if tot else S
    first = {n: get("fig11", dist_method, n, f=lambda r: r["storage_bytes"] / pool_bytes) for n in NS}
    rep = {n: get("fig11-repeat", dist_method, n, f=lambda r: r["storage_bytes"] / pool_bytes) for n in NS}
    fv = {n: s["median"] for n, s in first.items() if s}
    rv = {n: s["median"] for n, s in rep.items() if s}
    ok = bool(fv) and all(0.98 <= v <= 1.02 for v in fv.values()) and bool(rv) and all(v <= 0.01 for v in rv.values())
    goals.append(("P2", f"`{dist_method}`: storage bytes ÷ pool size = 1.00 ± 2 % (first), ~0 (≤ 0.01, repeat)",
                  "first: " + ", ".join(f"N={n}: {v:.3f}" for n, v in fv.items()) + "; repeat: " +
                  ", ".join(f"N={n}: {v:.4f}" for n, v in rv.items()), "pass" if ok else "MISSED"))
else:
    goals.append(("P2", "storage bytes ÷ data = 1.00 (first), ~0 (repeat)", "needs `sw-pool load` or `sw-pool cp`", NA))

if dist_method == "skip":
    pass
elif dist_method:
    both = [n for n in NS if get("fig11", dist_method, n) and get("fig11", "sbcast", n)]
    crit = f"`{dist_method}` ÷ `sbcast` ≤ 0.5 at N = {maxn} (both end to end: on local disk and sha256sum done on every node)"
    if both:
        vals = {n: get("fig11", dist_method, n)["median"] / get("fig11", "sbcast", n)["median"] for n in both}
        txt = ", ".join(f"N={n}: {v:.2f}" for n, v in vals.items())
        if maxn in vals:
            goals.append(("P3", crit, txt, "pass" if vals[maxn] <= 0.5 else "MISSED"))
        else:
            goals.append(("P3", crit, txt + f" (no complete N = {maxn} rows in this run)", "not measured at N = %d" % maxn))
    else:
        goals.append(("P3", crit, "a row is missing", "MISSED"))
else:
    goals.append(("P3", "sw-pool ÷ sbcast ≤ 0.5 at N = 8", "needs `sw-pool load` or `sw-pool cp`", NA))

p4r = {}
for kind, _ in P4_KINDS[1:]:
    for op in ("hash", "read"):
        for t in ("cold", "warm"):
            a, b = get("p4", kind, 1, op, t, f=phase_of("op")), get("p4", "native", 1, op, t, f=phase_of("op"))
            if a and b:
                p4r[(kind, op, t)] = a["median"] / b["median"]
if ("squashfuse_ll", "hash", "cold") in p4r:
    c, w = p4r[("squashfuse_ll", "hash", "cold")], p4r.get(("squashfuse_ll", "hash", "warm"))
    ok = c <= 1.15 and (w is None or w <= 1.15)
    goals.append(("P4", "sha256sum through the default mount (squashfuse_ll) ÷ native local disk ≤ 1.15",
                  f"cold {c:.2f}, warm {fmt(w)} (fuse2fs: cold {fmt(p4r.get(('fuse2fs', 'hash', 'cold')))}, warm {fmt(p4r.get(('fuse2fs', 'hash', 'warm')))})",
                  "pass" if ok else "MISSED"))
else:
    goals.append(("P4", "mount read overhead ≤ 1.15", *not_run("p4")))

a, b = get("smallfiles", "pool", 1, "md5sum"), get("smallfiles", "shared", 1, "md5sum")
if a and b:
    v = a["median"] / b["median"]
    goals.append(("P5", "md5sum of every small file: in a pool ÷ on shared storage ≤ 0.1",
                  f"{a['median']:.2f} s ÷ {b['median']:.2f} s = {v:.3f}", "pass" if v <= 0.1 else "MISSED"))
else:
    goals.append(("P5", "small files in a pool ÷ shared storage ≤ 0.1", *not_run("smallfiles")))

# ------------------------------------------------------------------ report.md
L = []
# Busy means other work: judged by the load before the first run. The end (and any observed) load
# includes the benchmark's own nodes (N ranks, sshfs, N sha256sums at N = 8), so it is only reported.
las = [float(x.split()[0]) for x in ((meta.get("loadavg_start"),) if meta.get("loadavg_start")
                                     else meta.get("loadavg_observed", [])) if x]
busy = bool(las) and max(las) > 0.5 * meta["host_cores"]
L.append(f"# sw-pool benchmark report{' (--quick smoke run: sizes too small to mean anything)' if meta['quick'] else ''}\n")
L.append(f"Run {meta['started']} – {meta.get('finished') or 'interrupted after ' + str(meta.get('interrupted_after', '?'))}, `bench/run{' --quick' if meta['quick'] else ''}`, sw-pool {meta['swpool']['version'].split()[-1]} (git {meta['swpool']['git']}), {meta['host_cores']} host cores.\n")
if not meta.get("complete", True):
    L.append("> **Interrupted run**: bench/run did not finish. Everything below comes from the runs that did finish; "
             "configurations and sections without runs are shown as missing (–), never filled in.\n")
if meta.get("note"):
    L.append(f"> {meta['note']}\n")
if busy:
    seen_la = f"load average {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end" if meta.get("loadavg_start") else \
        "load averages " + "; ".join(meta.get("loadavg_observed", [])) + " read during the run"
    L.append(f"> **The machine was busy during this run** ({seen_la}, on {meta['host_cores']} cores: other engineers' builds and tests). "
             "All nodes share these cores and one page cache, so CPU-bound steps (ssh encryption, hashing, FUSE) ran late and the figures below are pessimistic and noisy. "
             "Only a run on an otherwise idle machine is meaningful: rerun `make bench` then.\n")
elif las:
    L.append(f"Load average {meta['loadavg_start']} at the start (idle enough), {meta['loadavg_end']} at the end "
             "(the end includes this benchmark's own nodes).\n")
red = []
if meta["size_mb"] != 1000:
    red.append(f"a {meta['size_mb']} MB file instead of 1 GB")
if (meta.get("tree") or {}).get("files") not in (None, 56000) and "smallfiles" in meta["sections"]:
    red.append(f"{meta['tree']['files']} small files instead of 56,000")
if (meta.get("sparse") or {}).get("image_bytes") and round(meta["sparse"]["image_bytes"] / 1e6) != 4000:
    red.append(f"a {meta['sparse']['image_bytes'] / 1e6:,.0f} MB sparse image instead of 4 GB")
if red and not meta["quick"]:
    L.append(f"> **Reduced sizes** (to fit the time this run had): {'; '.join(red)}. Ratios are comparable; absolute times are not the paper's. `make bench` without overrides runs the full sizes.\n")
L.append("## Set-up\n")
L.append(f"- Virtual cluster (`testbed/`): {TB['nodes_up']} nodes up, every node link capped at **{TB['node_rate']}** both ways, storage server egress capped at **{TB['storage_rate']}** "
         f"(the benchmark model of docs/architecture.md{'' if TB['managed_by_bench'] else '; testbed brought up by the caller, not by bench/run'}). "
         f"Wire limit for one file to every node = size ÷ slowest cap = {fmt(S / WIRE_BPS if WIRE_BPS else None)} s.")
def num(v, unit="", f="{:,}"):
    return (f.format(v) + unit) if v is not None else "not recorded"


bs = meta.get("build_seconds") or {}
L.append(f"- Data: `head -c {meta['size_mb']}MB /dev/urandom` = {S:,} bytes (the paper's Figure 9), in a squashfs pool ({num(meta.get('pool_sqfs_bytes'), ' B')}, `sw-pool build`, {num(bs.get('random.sqfs'), ' s', '{:.1f}')}) "
         f"and an ext2 pool ({num(meta.get('pool_ext2_bytes'), ' B')}, `sw-pool build{' -s 1020MB' if meta['size_mb'] == 1000 else ''}`, {num(bs.get('random.ext2'), ' s', '{:.1f}')}) on the shared storage.")
L.append(f"- Every configuration run {meta['reps']} times, interleaved; medians with (min–max). The page cache is dropped before every run (the nodes share one page cache); "
         "shared storage is sshfs without `kernel_cache`, so every read goes over the capped link. Storage bytes are the storage server NIC's transmit counter around each run (`testbed/storage-bytes`; ≈ file bytes + 0.4 %).")
L.append("- Every run's result is checked: each node's sha256 (md5 list for the small files, size for the sparse copies) must match the source, or the run counts as failed.")
L.append(f"- sw-pool `load`: **{'available' if has_load else 'not available in this build'}**; sw-pool `cp`: **{'available' if has_cp else 'not available in this build'}**.\n")

L.append("## Goals\n")
L.append("| goal | criterion | measured | verdict |\n|---|---|---|---|")
for g in goals:
    L.append(f"| {g[0]} | {g[1]} | {g[2]} | **{g[3]}** |")
L.append("")

L.append(f"## Figure 11: {S / 1e6:,.0f} MB to N nodes, then sha256sum on every node\n")
if "fig11_time_vs_nodes.png" in plots:
    L.append("![time vs nodes](fig11_time_vs_nodes.png)\n")
if not have("fig11"):
    missing_section("fig11")
L.append("Seconds, median (min–max), end to end (first command started → every node's hash done); sbcast timed inside its batch job (without Slurm's job start).\n")
L.append("| method | " + " | ".join(f"N={n}" for n in NS) + " |\n|---|" + "---|" * len(NS))
for m, lab in METHODS.items():
    if m in SWPOOL_METHODS and not has_load:
        L.append(f"| {lab} | " + " | ".join("not available in this build" for _ in NS) + " |")
        continue
    if m == "swpool-cp" and not has_cp:
        L.append(f"| {lab} | " + " | ".join("not available in this build" for _ in NS) + " |")
        continue
    row = []
    for n in NS:
        s = get("fig11", m, n)
        row.append(cell(s) + (f" ({failed[('fig11', m, n, '', '')]} failed)" if failed.get(("fig11", m, n, "", "")) else ""))
    L.append(f"| {lab} | " + " | ".join(row) + " |")
L.append("")
L.append("## Figure 12: where the time goes\n")
if "fig12_phases.png" in plots:
    L.append("![phases](fig12_phases.png)\n")
L.append("Phases are the slowest node's, medians over the runs: `copy`/`sbcast`/`cp`/`load` = getting the bytes to the node (and mounting, for `load`), `mount` = starting the FUSE helper, `hash` = sha256sum of the file. "
         + ("For sw-pool the bar is its own `--json` total, what `mpirun` adds around it (starting the ranks on the nodes through the testbed's rsh agent, exiting), then the harness's mount and hash." if (has_load or has_cp) else
            "sw-pool's own per-phase breakdown (`load -v --json`: preflight, read, distribute, write, verify, commit, mount) is **not available in this build**; the bars show the other methods only."))
L.append("")
SWP = ["resolve_trust", "preflight", "read", "distribute", "write", "verify", "commit", "copy", "mount", "total"]
for m in ("swpool-cp", "swpool-load-sqfs", "swpool-load-ext2"):
    rows = []
    for n in NS:
        sw = [r["swpool"] for r in groups.get(("fig11", m, n, "", ""), []) if r.get("swpool")]
        if sw:
            ph = [x.get("phases", {}) for x in sw]
            rows.append(f"| {n} | " + " | ".join(fmt(statistics.median([p[k] for p in ph if k in p])) if any(k in p for p in ph) else "–" for k in SWP)
                        + f" | {statistics.median([x.get('bytes_read_from_src', 0) for x in sw]) / 1e6:,.1f} MB | {sw[-1].get('algorithm') or '–'} |")
    if rows:
        L.append(f"`{m}`: sw-pool's own `--json` phases (world rank 0, seconds, medians). They overlap (reading, sending, verifying and writing are pipelined), so they do not add up to `total`:\n")
        L.append("| N | " + " | ".join(SWP) + " | read from SRC | algorithm |\n|---|" + "---|" * (len(SWP) + 2))
        L.extend(rows)
        L.append("")
L.append("## Shared-storage load\n")
if "storage_bytes_vs_nodes.png" in plots:
    L.append("![storage bytes](storage_bytes_vs_nodes.png)\n")
L.append("Bytes served by the storage server ÷ file size, median per run.\n")
L.append("| method | " + " | ".join(f"N={n}" for n in NS) + " |\n|---|" + "---|" * len(NS))
for m, lab in METHODS.items():
    if (m in SWPOOL_METHODS and not has_load) or (m == "swpool-cp" and not has_cp):
        L.append(f"| {lab} | " + " | ".join("not available in this build" for _ in NS) + " |")
        continue
    L.append(f"| {lab} | " + " | ".join(
        (lambda s: f"{s['median'] * S / 1e6:,.0f} MB ({s['median']:.3f}×)" if s else "–")(get("fig11", m, n, f=lambda r: r["storage_bytes"] / S)) for n in NS) + " |")
for m in ("swpool-cp", "swpool-load-sqfs"):
    rr = [get("fig11-repeat", m, n, f=lambda r: r["storage_bytes"]) for n in NS]
    if any(rr):
        L.append(f"| {METHODS[m]}, repeated (already cached) | " + " | ".join((f"{s['median']:,.0f} B" if s else "–") for s in rr) + " |")
L.append("")

L.append("## P4: reading through the mount vs natively (node1, images on node-local disk)\n")
if "p4_mount_overhead.png" in plots:
    L.append("![P4](p4_mount_overhead.png)\n")
L.append("The FUSE helpers sw-pool's `mount` starts (squashfuse_ll for squashfs, fuse2fs for ext), run directly on the node, mount time excluded; cold = page cache dropped after mounting.\n")
if not have("p4"):
    missing_section("p4")
    P4_ROWS = []
else:
    L.append("| | sha256sum cold | sha256sum warm | read cold | read warm |\n|---|---|---|---|---|")
    P4_ROWS = P4_KINDS
for kind, lab in P4_ROWS:
    row = []
    for op in ("hash", "read"):
        for t in ("cold", "warm"):
            s = get("p4", kind, 1, op, t, f=phase_of("op"))
            r = p4r.get((kind, op, t))
            row.append(cell(s) + (f" = **{r:.2f}×**" if r else ""))
    L.append(f"| {lab} | " + " | ".join(row) + " |")
L.append("")

t = meta.get("tree", {})
L.append("## Oslo disk-image study, Table 1: many small files (node1)\n")
if "smallfiles.png" in plots:
    L.append("![small files](smallfiles.png)\n")
L.append(f"Tree: `bench/gen-tree.py --files {t.get('files')}` ({(t.get('generator') or 'size not recorded') + '; '}the source-tree size mix; the Debian linux-source tarball would be 1.4 GB / 80k files and xz-bound on 2 cores). "
         f"`tar -xf` of an uncompressed tarball on node-local disk; `find . -type f -exec md5sum {{}} +` (batched, not one process per file: the paper's `\\;` would time 2 shared cores forking); `rm -rf`. "
         f"The pool is `sw-pool build` of the same tree ({num(bs.get('tree.sqfs'), ' s', '{:.1f}')} on the login node) on shared storage, mounted with squashfuse_ll on the node; it is read-only, so only md5sum applies.\n")
if not have("smallfiles"):
    missing_section("smallfiles")
else:
    L.append("| operation | node-local disk | shared storage | pool on shared storage |\n|---|---|---|---|")
for op in (("untar", "md5sum", "rm", "mount") if have("smallfiles") else ()):
    row = []
    for w, _ in SF_WHERE:
        s = get("smallfiles", w, 1, op)
        row.append(cell(s) if s else ("n/a (read-only)" if w == "pool" and op in ("untar", "rm") else "–" if op != "mount" else ("–" if w == "pool" else "n/a")))
    L.append(f"| {op} | " + " | ".join(row) + " |")
sb = [get("smallfiles", w, 1, "md5sum", f=lambda r: r["storage_bytes"]) for w, _ in SF_WHERE]
if have("smallfiles"):
    L.append("| storage bytes served during md5sum | " + " | ".join((f"{s['median'] / 1e6:,.1f} MB" if s else "–") for s in sb) + " |")
L.append("")

L.append("## Sparse pools\n")
if not have("sparse"):
    missing_section("sparse")
if "sparse.png" in plots:
    L.append("![sparse](sparse.png)\n")
if sp.get("image_bytes"):
    L.append(f"An ext4 pool of {sp['image_bytes'] / 1e6:,.0f} MB holding {sp['data_bytes'] / 1e6:,.0f} MB of random data ({sp['image_allocated_bytes'] / 1e6:,.0f} MB allocated on the storage) "
             f"against the dense {sp['data_bytes'] / 1e6:,.0f} MB file, copied to {sp['n']} nodes at once. `cp --sparse=always` re-creates the holes on the node, but the storage-bytes column shows what it read over the network to find them; "
             "sw-pool cp skips holes (SEEK_DATA) and all-zero chunks. P7 = sparse ÷ dense ≤ 1.2.\n")
    L.append("| method | seconds | storage bytes | sparse ÷ dense |\n|---|---|---|---|")
    for m, lab in SP_METHODS:
        if m.startswith("swpool") and not has_cp:
            L.append(f"| {lab} | not available in this build | | |")
            continue
        s = get("sparse", m, sp["n"]); b = get("sparse", m, sp["n"], f=lambda r: r["storage_bytes"])
        ratio = ""
        if m.endswith("sparse"):
            d = get("sparse", m.replace("sparse", "dense"), sp["n"])
            if s and d:
                ratio = f"**{s['median'] / d['median']:.2f}**"
        L.append(f"| {lab} | {cell(s)} | {(b['median'] / 1e6 if b else 0):,.0f} MB | {ratio} |")
    L.append("")

nfail = sum(failed.values())
L.append("## Failed runs\n")
if nfail:
    L.append(f"{nfail} run(s) failed and are left out of the medians:\n")
    for r in runs:
        if not (r.get("ok", True) and not r.get("errors")):
            L.append(f"- {r['section']} {r['method']} N={r['n']}{(' ' + r['op']) if r.get('op') else ''} rep {r['rep']}: rc {r.get('rc')}; {'; '.join(r.get('errors', []))[:300]}")
else:
    L.append("None: every run finished and produced the right digests.")
L.append("")
L.append("## Raw data\n")
L.append("`results.jsonl` (one line per run, with per-node phase times and sw-pool's JSON), `results.csv` (the same, flat), `meta.json` (caps, sizes, load averages).")
open(os.path.join(OUT, "report.md"), "w").write("\n".join(L) + "\n")
print(f"{len(runs)} runs, {nfail} failed; plots: {', '.join(plots)}")
