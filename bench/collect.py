#!/usr/bin/env python3
"""Append one benchmark run as a JSON line to RESULTS (used by bench/run; not meant to be called by hand).

usage: collect.py RESULTS key=value... [--expect-hash H] [--expect-md5count N] -- OUTPUT-FILES...

OUTPUT-FILES are what the run printed (one per node, or one for a Slurm job / mpirun). Lines understood:
  PH <phase> <start> <end>   a phase on one node (epoch seconds); the run's phase time is the
                             slowest node's (max over nodes)
  HASH <hex>                 the digest one node computed (checked against --expect-hash)
  {... "phases": {...} ...}  sw-pool's --json report (kept as "swpool")
Everything is measured by bench/run; this script only parses and stores it.
"""
import json, sys

args = sys.argv[1:]
out = args.pop(0)
rec, files, expect_hash = {}, [], None
i = 0
while i < len(args):
    a = args[i]
    if a == "--":
        files = args[i + 1:]
        break
    if a == "--expect-hash":
        expect_hash = args[i + 1]
        i += 2
        continue
    k, v = a.split("=", 1)
    try:
        rec[k] = int(v)
    except ValueError:
        try:
            rec[k] = float(v)
        except ValueError:
            rec[k] = v
    i += 1

phases, hashes, swpool, errors = {}, [], [], []
for f in files:
    try:
        text = open(f, errors="replace").read()
    except OSError as e:
        errors.append(str(e))
        continue
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("PH "):
            p = line.split()
            if len(p) == 4:
                d = float(p[3]) - float(p[2])
                phases[p[1]] = max(phases.get(p[1], 0.0), d)
        elif line.startswith("HASH "):
            hashes.append(line.split()[1])
        elif line.startswith("ERROR"):
            errors.append(line)

    # sw-pool's --json report: one line or pretty-printed over several
    dec = json.JSONDecoder()
    pos = 0
    while True:
        i = text.find("{", pos)
        if i < 0:
            break
        if i == 0 or text[i - 1] == "\n":
            try:
                j, end = dec.raw_decode(text, i)
            except ValueError:
                pos = i + 1
                continue
            if isinstance(j, dict) and "phases" in j:
                swpool.append(j)
            pos = end
        else:
            pos = i + 1

rec["phases"] = {k: round(v, 4) for k, v in phases.items()}
if swpool:
    rec["swpool"] = swpool[0]
rec["hashes"] = len(hashes)
rec["ok"] = rec.get("rc", 0) == 0
if expect_hash is not None:
    rec["hashes_ok"] = bool(hashes) and all(h == expect_hash for h in hashes)
    if not rec["hashes_ok"]:
        errors.append(f"{len(hashes)} digests, expected {expect_hash}, got {sorted(set(hashes))}")
if rec.get("rc", 0) != 0:  # keep the end of what the failing command said, for the report
    tail = []
    for f in files:
        try:
            tail += [l.strip() for l in open(f, errors="replace") if l.strip() and not l.startswith(("PH ", "HASH ", "-----"))]
        except OSError:
            pass
    if tail:
        errors.append("output: " + " / ".join(tail[-4:])[:400])
if errors:
    rec["errors"] = errors
    rec["ok"] = False
with open(out, "a") as f:
    f.write(json.dumps(rec, sort_keys=True) + "\n")
