#!/usr/bin/env python3
"""Structure checks of `make lint`: no Rust source file over 800 lines, and no import cycle between
the top-level modules of a library crate (a cycle inside one module is that module's business).

A module's dependencies are the other top-level modules of its crate that its files name
(`crate::m`, `use crate::{m, ..}`, `super::m` from a top-level file). Cycles are the strongly
connected components of that graph with more than one module.

Known cycles that are being taken apart are listed in tools/module-cycles.allow (one cycle per
line: its modules, sorted, space-separated). The check fails on any cycle not listed there, and on
a listed cycle that no longer exists (so the list only shrinks). Usage: lint-structure.py [--graph]
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 800
ALLOW = os.path.join(ROOT, "tools", "module-cycles.allow")


def rust_files():
    for top in ("crates", "tools", "fuzz"):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x not in ("target", ".git")]
            for f in files:
                if f.endswith(".rs"):
                    yield os.path.join(d, f)


def long_files():
    out = []
    for p in rust_files():
        with open(p, encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            out.append((os.path.relpath(p, ROOT), n))
    return out


def crate_graph(src):
    """Top-level module -> set of top-level modules it names, for one crate's src/."""
    mods = {}
    for e in os.listdir(src):
        p = os.path.join(src, e)
        if e.endswith(".rs") and e not in ("lib.rs", "main.rs"):
            mods[e[:-3]] = [p]
        elif os.path.isdir(p):
            files = []
            for d, _, fs in os.walk(p):
                files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
            mods[e] = files
    names = set(mods)
    # names the crate root re-exports from its modules (`pub use error::{Error, Result};`)
    reexported = {}
    with open(os.path.join(src, "lib.rs"), encoding="utf-8") as f:
        root = f.read()
    for m, items in re.findall(r"pub use (\w+)::\{([^}]*)\}", root):
        for it in items.split(","):
            reexported[it.strip().split(" as ")[-1]] = m
    for m, it in re.findall(r"pub use (\w+)::(\w+);", root):
        reexported[it] = m
    ref = re.compile(r"\bcrate::(\w+)")
    group = re.compile(r"\buse\s+crate::\{([^}]*)\}", re.S)
    graph = {m: set() for m in names}
    for m, files in mods.items():
        for p in files:
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read()
            # tests are not the library's structure, and comments are not dependencies
            text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
            text = re.sub(r"//[^\n]*", "", text)
            found = {reexported.get(x, x) for x in ref.findall(text)}
            for g in group.findall(text):
                found |= {x.strip().split("::")[0] for x in g.split(",")}
            if os.path.dirname(p) == src:
                found |= set(re.findall(r"\bsuper::(\w+)", text))
            graph[m] |= {x for x in found if x in names and x != m}
    return graph


def sccs(graph):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(" ".join(sorted(comp)))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    failed = False
    for p, n in long_files():
        print(f"lint-structure: {p} has {n} lines (at most {MAX_LINES}): split it by role")
        failed = True
    allowed = set()
    if os.path.exists(ALLOW):
        with open(ALLOW) as f:
            allowed = {l.split("#")[0].strip() for l in f} - {""}
    seen = set()
    crates = os.path.join(ROOT, "crates")
    for c in sorted(os.listdir(crates)):
        src = os.path.join(crates, c, "src")
        if not os.path.isfile(os.path.join(src, "lib.rs")):
            continue
        g = crate_graph(src)
        if "--graph" in sys.argv:
            for m in sorted(g):
                print(f"{c}: {m} -> {' '.join(sorted(g[m]))}")
        for cyc in sccs(g):
            key = f"{c}: {cyc}"
            seen.add(key)
            if key not in allowed:
                print(f"lint-structure: import cycle between modules of {c}: {cyc}")
                failed = True
    for key in sorted(allowed - seen):
        print(f"lint-structure: '{key}' is no longer a cycle: remove it from tools/module-cycles.allow")
        failed = True
    if failed:
        sys.exit(1)
    print(f"lint-structure: no file over {MAX_LINES} lines, no module cycle beyond the {len(allowed)} listed")


if __name__ == "__main__":
    main()
