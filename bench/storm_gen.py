#!/usr/bin/env python3
"""Generate a Pynamic-like Python package (written for sw-pool; not LLNL's code).

    storm_gen.py OUTDIR M F [--python PYTHON] [-j JOBS]

OUTDIR/site/stormpkg/: M CPython extension modules mod_<i> (stormpkg/mod_<i>.so), each linked
against its own shared library stormpkg/libs/libstorm<i>.so of F functions (RUNPATH $ORIGIN/libs),
and a driver module stormpkg/driver.py: `python3 -m stormpkg.driver` imports every module, calls
every function once (through the module's call_all), and prints one JSON line with the rank, the
seconds from interpreter start to the end of the imports and calls, and the seconds since
$STORM_T0 (the launcher's clock: the slowest rank's value is the job's time to the end of import).
Published procurement parameters (e.g. 900 1250) work; the defaults of bench/storm.sh are scaled
to a 2-core machine.
"""
import argparse
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

ap = argparse.ArgumentParser()
ap.add_argument("outdir")
ap.add_argument("m", type=int)
ap.add_argument("f", type=int)
ap.add_argument("--python", default=sys.executable)
ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
a = ap.parse_args()

pkg = os.path.join(a.outdir, "site", "stormpkg")
libs = os.path.join(pkg, "libs")
src = os.path.join(a.outdir, "src")
for d in (pkg, libs, src):
    os.makedirs(d, exist_ok=True)
inc = subprocess.check_output(
    [a.python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"], text=True).strip()
suffix = subprocess.check_output(
    [a.python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"], text=True).strip()


def lib_source(i):
    body = [f"int storm_{i}_{j}(int x) {{ return x * {j + 1} + {i}; }}" for j in range(a.f)]
    return "\n".join(body) + "\n"


def mod_source(i):
    decls = "\n".join(f"int storm_{i}_{j}(int);" for j in range(a.f))
    calls = "\n".join(f"  s += storm_{i}_{j}(s & 7);" for j in range(a.f))
    return f"""#define PY_SSIZE_T_CLEAN
#include <Python.h>
{decls}
static PyObject *call_all(PyObject *self, PyObject *args) {{
  long s = 1;
{calls}
  return PyLong_FromLong(s);
}}
static PyMethodDef methods[] = {{{{"call_all", call_all, METH_NOARGS, "call every function once"}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "mod_{i}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_mod_{i}(void) {{ return PyModule_Create(&def); }}
"""


def build(i):
    lc = os.path.join(src, f"lib{i}.c")
    mc = os.path.join(src, f"mod{i}.c")
    with open(lc, "w") as fh:
        fh.write(lib_source(i))
    with open(mc, "w") as fh:
        fh.write(mod_source(i))
    lib = os.path.join(libs, f"libstorm{i}.so")
    subprocess.check_call(["gcc", "-O0", "-shared", "-fPIC", "-o", lib, lc, f"-Wl,-soname,libstorm{i}.so"])
    subprocess.check_call(["gcc", "-O0", "-shared", "-fPIC", f"-I{inc}", "-o",
                           os.path.join(pkg, f"mod_{i}{suffix}"), mc, f"-L{libs}", f"-lstorm{i}",
                           "-Wl,--enable-new-dtags,-rpath,$ORIGIN/libs"])


with ThreadPoolExecutor(a.jobs) as ex:
    list(ex.map(build, range(a.m)))

with open(os.path.join(pkg, "__init__.py"), "w") as fh:
    fh.write(f"M = {a.m}\nF = {a.f}\n")
with open(os.path.join(pkg, "driver.py"), "w") as fh:
    fh.write('''import importlib, json, os, sys, time
t_start = time.time()
from . import M
total = 0
for i in range(M):
    total += importlib.import_module("stormpkg.mod_%d" % i).call_all()
extra = os.environ.get("STORM_EXTRA")
if extra:
    for name in extra.split(","):
        importlib.import_module(name)
t_end = time.time()
t0 = float(os.environ.get("STORM_T0", t_start))
print(json.dumps({"rank": int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", 0))),
                  "host": os.uname().nodename, "import_s": round(t_end - t_start, 4),
                  "since_t0_s": round(t_end - t0, 4), "modules": len(sys.modules), "check": total % 1000}), flush=True)
''')
print(f"generated {a.m} extension modules x {a.f} functions in {pkg}")
