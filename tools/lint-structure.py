#!/usr/bin/env python3
"""Structure checks of `make lint`: no Rust source file over 800 lines, no import cycle between the
top-level modules of a library crate (a cycle inside one module is that module's business), and no
read of the process environment outside the configuration layer.

A module's dependencies are the other top-level modules of its crate that its files name
(`crate::m`, `use crate::{m, ..}`, `super::m` from a top-level file). Cycles are the strongly
connected components of that graph with more than one module.

Known cycles that are being taken apart are listed in tools/module-cycles.allow (one cycle per
line: its modules, sorted, space-separated). The check fails on any cycle not listed there, and on
a listed cycle that no longer exists (so the list only shrinks).

The environment is read once, by `swpool_core::config::Environment::capture`, and passed down. The
check fails on any other read (`std::env::var`, `env::var_os`, `std::env::vars`, `libc::getenv`,
`EnvVar::X.get()` and its siblings) in the sources of every crate outside `crates/swpool-node/src/config/`
(ENV_WHOLE names the files that may take the whole environment, `env::vars_os()`, as one value,
and why). Test code is not checked: `tests.rs` files and the items marked
`#[cfg(test)]` or `#[test]`. Usage: lint-structure.py [--graph]

Functions longer than MAX_FN_LINES lines (from the `fn` line to its closing brace) in the sources
of every crate, of the tools and of the fuzz targets (test code excluded, as above) are listed.
A long function fails the check unless FN_LINES_KNOWN names it (the ones still being taken
apart); a name there whose function is no longer long fails too, so the list only shrinks.
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


# where the environment may be read, and what is checked
ENV_LAYER = "crates/swpool-node/src/config/"
ENV_CHECKED = tuple(sorted(
    f"crates/{c}/src" for c in os.listdir(os.path.join(ROOT, "crates"))
    if os.path.isdir(os.path.join(ROOT, "crates", c, "src"))))
# reads that are not configuration: the whole environment handled as one value (file -> why)
ENV_WHOLE = {
    "crates/sw-pool-mount-helper/src/main.rs":
        "the root helper keeps SUDO_UID and clears the caller's environment before it parses anything",
    "crates/swpool-env/src/init.rs":
        "the environment's pid 1 hands the caller's environment on to the command",
}
ENV_READS = re.compile(
    r"\b(?:std::)?env::(?:var|var_os|vars|vars_os)\b"  # std::env::var, env::var_os, ...
    r"|\bstd::env::\{[^}]*\bvars?(?:_os)?\b"  # use std::env::{var, ..}
    r"|\blibc::(?:secure_)?getenv\b"  # libc::getenv
    r"|\bEnvVar::\w+\s*\.\s*(?:get|get_os|get_nonempty|is_one)\s*\("  # EnvVar::X.get()
)
TEST_ATTR = re.compile(r"#\[\s*(?:cfg\s*\(\s*test\s*\)|test)\s*\]")


def blank_non_code(text):
    """`text` with comments, string and character literals replaced by spaces (newlines kept), so
    that braces and patterns are only found in code."""
    out, i, n = list(text), 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            blank(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # a character literal ('x', '\n', '\u{..}'); otherwise a lifetime
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]*\}|.)|[^'\\\n])'", text[i:i + 12])
            if m:
                blank(i, i + m.end())
                i += m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def without_tests(code):
    """`code` (from blank_non_code) with every item marked #[cfg(test)] or #[test] blanked."""
    out = list(code)
    for m in TEST_ATTR.finditer(code):
        i, depth = m.end(), 0
        while i < len(code):
            c = code[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth <= 0:
                    break
            elif c == ";" and depth == 0:
                break
            i += 1
        for k in range(m.start(), min(i + 1, len(code))):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


MAX_FN_LINES = 150
FN_LINES_FAIL = True
# The functions still over MAX_FN_LINES, by file and name, each reported but not failing; any other
# fails, and one listed here that is no longer long fails until it is taken off the list.
FN_LINES_KNOWN: set = set()
FN_NAME = re.compile(r"\bfn\s+(\w+)")


def long_functions():
    """(lines, file, line, name) of each function over MAX_FN_LINES lines outside test code, the
    longest first."""
    found = []
    for p in rust_files():
        rel = os.path.relpath(p, ROOT)
        if "/tests/" in rel or rel.endswith("/tests.rs"):
            continue
        with open(p, encoding="utf-8", errors="replace") as fh:
            code = without_tests(blank_non_code(fh.read()))
        for m in FN_NAME.finditer(code):
            # the body's opening brace; a `;` first is a declaration without a body
            i = m.end()
            while i < len(code) and code[i] not in "{;":
                i += 1
            if i >= len(code) or code[i] == ";":
                continue
            depth, j = 0, i
            while j < len(code):
                if code[j] == "{":
                    depth += 1
                elif code[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            first = code.count("\n", 0, m.start()) + 1
            n = code.count("\n", m.start(), j) + 1
            if n > MAX_FN_LINES:
                found.append((n, rel, first, m.group(1)))
    return sorted(found, key=lambda f: (-f[0], f[1], f[2]))


def env_reads():
    """(file, line, text) of each environment read outside the configuration layer."""
    found = []
    for top in ENV_CHECKED:
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(x for x in dirs if x != "tests")
            for f in sorted(files):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, ROOT)
                if not f.endswith(".rs") or f == "tests.rs" or rel.startswith(ENV_LAYER):
                    continue
                with open(p, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                code = without_tests(blank_non_code(text))
                lines = text.split("\n")
                for m in ENV_READS.finditer(code):
                    line = code.count("\n", 0, m.start()) + 1
                    whole = m.group(0).endswith("vars_os") or '"SUDO_UID"' in lines[line - 1]
                    if rel in ENV_WHOLE and whole:
                        continue
                    found.append((rel, line, lines[line - 1].strip()))
    return found


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
    for p, line, text in env_reads():
        print(f"lint-structure: {p}:{line}: reads the process environment: {text}\n"
              f"  only {ENV_LAYER} reads it (config::Environment::capture, once); take the value "
              f"from the Environment passed down (swpool-sys: as a parameter), or add the variable "
              f"to config::EnvVar / config::HostVar")
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
    long_fns = long_functions()
    for n, p, line, name in long_fns:
        known = (p, name) in FN_LINES_KNOWN
        print(f"lint-structure: {p}:{line}: fn {name} has {n} lines (at most {MAX_FN_LINES}): "
              f"split it into named steps{' (known: FN_LINES_KNOWN)' if known else ''}")
        if FN_LINES_FAIL and not known:
            failed = True
    for p, name in sorted(FN_LINES_KNOWN - {(p, name) for _, p, _, name in long_fns}):
        print(f"lint-structure: fn {name} in {p} is no longer over {MAX_FN_LINES} lines: remove it "
              f"from FN_LINES_KNOWN in tools/lint-structure.py")
        failed = True
    if failed:
        sys.exit(1)
    fns = (f"{len(long_fns)} known function(s) over {MAX_FN_LINES} lines, listed above (any other "
           f"fails)" if long_fns else f"no function over {MAX_FN_LINES} lines")
    print(f"lint-structure: no file over {MAX_LINES} lines, no module cycle beyond the {len(allowed)} listed, "
          f"no environment read outside {ENV_LAYER}; {fns}")


if __name__ == "__main__":
    main()
