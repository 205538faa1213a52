#!/usr/bin/env bash
# Python environments as pools, one of each kind: a venv over the system python3, a uv environment
# over a uv-managed interpreter (laid out by hand where uv keeps them: uv cannot download one here)
# and a conda environment in conda-pack's layout (built by hand: no conda or micromamba can be
# installed here), each with numpy + scipy from the package registry (wheels cached under
# target/tmp/pyenv-wheels), built with `sw-pool build --from-env`, signed, loaded on 4 nodes as the
# unprivileged user inside a Slurm job with the original trees made unreadable to that user;
# `module load` + `python -c 'import scipy.stats'` works on every node and strace shows no access
# to the original environment, the managed interpreter or the system's standard library.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
uid=$(id -u "$TB_USER")
W=$TB/scratch/t83-$$
E=$TB/export/t83-$$          # the storage server's disk; nodes see it as $TB/shared/t83-$$
cleanup() {
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && \$2 ~ \"^/tmp/sw-pool-$uid/\" {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\" || umount -l \"\$m\"; done; rm -rf /tmp/sw-pool-$uid /tmp/t83-trace.*" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$W/keys" "$W/trusted" "$W/out" "$E/pools/sci" "$E/pools/sciuv" "$E/pools/scicon"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$REPO/tests/cluster/srun-mpi" "$W/bin/"
SW=$W/bin/sw-pool

# --- the venv: /usr/bin/python3 -m venv, numpy + scipy from the registry (or the cache)
PY=/usr/bin/python3
ENV=$W/sci-env
CACHE=$REPO/target/tmp/pyenv-wheels
mkdir -p "$CACHE"
if ! out=$("$PY" -m venv "$ENV" 2>&1); then
  fail "python3 -m venv" "$(tail -n 3 <<< "$out") (install python3-venv: tools/setup-deps.sh)"; finish
fi
if ! "$ENV/bin/pip" install -q --no-index --find-links "$CACHE" numpy scipy >/dev/null 2>&1; then
  "$ENV/bin/pip" download -q -d "$CACHE" numpy scipy >/dev/null 2>&1 || true
  if ! out=$("$ENV/bin/pip" install -q --no-index --find-links "$CACHE" numpy scipy 2>&1); then
    skip "numpy + scipy in the venv" "neither $CACHE nor the package registry has them: $(tail -n 2 <<< "$out")"; finish
  fi
fi
want=$("$ENV/bin/python" -c 'import scipy; print(scipy.__version__)')
stdlib=$("$ENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
pyv=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pyfull=$("$PY" -c 'import platform; print(platform.python_version())')

# A CPython laid out as a stand-alone prefix, as uv's managed Pythons and conda have it: the host's
# interpreter copied to PREFIX/bin/pythonX.Y, its standard library to PREFIX/lib/pythonX.Y (no tests,
# no site- or dist-packages); Debian's interpreter reads dist-packages, where a .pth adds
# site-packages, the directory uv and conda install into.
standalone_python() {
  local prefix=$1 lib=$1/lib/python$pyv
  mkdir -p "$prefix/bin" "$prefix/lib"
  cp "$(readlink -f "$PY")" "$prefix/bin/python$pyv"
  ln -s "python$pyv" "$prefix/bin/python3"
  cp -a "$stdlib" "$lib"
  rm -rf "$lib/test" "$lib/dist-packages" "$lib/site-packages"
  mkdir -p "$lib/site-packages" "$lib/dist-packages"
  echo ../site-packages > "$lib/dist-packages/site-packages.pth"
}

# --- the uv environment: `uv venv` over a managed interpreter in a home directory of its own, then
# `uv pip install` (uv itself from the package registry, kept under target/tmp/pyenv-uv)
UVHOME=$W/home
MANAGED=$UVHOME/.local/share/uv/python/cpython-$pyfull-linux-x86_64-gnu
UVENV=$W/sci-uv
UV=$REPO/target/tmp/pyenv-uv/bin/uv
if [[ ! -x $UV ]] && "$PY" -m venv "$REPO/target/tmp/pyenv-uv" >/dev/null 2>&1; then
  "$REPO/target/tmp/pyenv-uv/bin/pip" install -q uv >/dev/null 2>&1 || true
fi
uv_env() { env HOME="$UVHOME" UV_CACHE_DIR="$W/uv-cache" UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1 "$UV" "$@"; }
standalone_python "$MANAGED"
if [[ ! -x $UV ]]; then
  skip "the uv environment" "uv is not installable from the package registry here"
  UVENV=
elif ! out=$(uv_env venv -q --python "$MANAGED/bin/python$pyv" "$UVENV" 2>&1 && uv_env pip install -q --python "$UVENV/bin/python" --no-index --find-links "$CACHE" numpy scipy 2>&1); then
  fail "uv venv + uv pip install numpy scipy" "$(tail -n 3 <<< "$out")"; finish
fi

# --- the conda environment, conda-pack's layout built by hand: the interpreter in the tree,
# numpy + scipy in its site-packages, a conda-meta record per package listing its files
CONDA=$W/conda/envs/sci
standalone_python "$CONDA"
ln -s "python$pyv" "$CONDA/bin/python"
if ! out=$("$ENV/bin/pip" install -q --no-index --find-links "$CACHE" --target "$CONDA/lib/python$pyv/site-packages" numpy scipy 2>&1); then
  fail "numpy + scipy into the conda environment" "$(tail -n 3 <<< "$out")"; finish
fi
mkdir -p "$CONDA/conda-meta"
(cd "$CONDA" && "$PY" - "$pyv" <<'PYEOF'
import json, os, sys
v = sys.argv[1]
sp = f"lib/python{v}/site-packages"
def record(name, version, roots):
    files = []
    for r in roots:
        for d, _, fs in os.walk(r):
            files += [os.path.join(d, f) for f in fs]
    paths = [{"_path": f, "path_type": "hardlink"} for f in sorted(files)]
    with open(f"conda-meta/{name}-{version}-0.json", "w") as o:
        json.dump({"name": name, "version": version, "build": "0", "files": sorted(files),
                   "paths_data": {"paths_version": 1, "paths": paths}}, o)
record("python", v, ["bin", f"lib/python{v}"])
for pkg in ("numpy", "scipy"):
    names = [n for n in os.listdir(sp) if n == pkg or n.startswith(pkg + "-") or n.startswith(pkg + ".")]
    info = [n for n in names if n.endswith(".dist-info")]
    version = info[0][len(pkg) + 1:-len(".dist-info")] if info else "0"
    record(pkg, version, [os.path.join(sp, n) for n in names])
PYEOF
)
[[ $("$CONDA/bin/python" -c 'import scipy; print(scipy.__version__)' 2>&1) == "$want" ]] ||
  { fail "the conda environment imports scipy $want" "$("$CONDA/bin/python" -c 'import scipy' 2>&1 | tail -n 2)"; finish; }

# --- each environment becomes a pool
# build NAME ENV KIND INCLUDED: build --from-env, then inspect says what it is
build_env() {
  local name=$1 env=$2 kind=$3 from=$4 out about
  if out=$("$SW" build -q --from-env "$env" --name "$name" --version 1 "$E/pools/$name/1.sqfs" 2>&1); then
    pass "build --from-env: the $kind environment (scipy $want) became a pool"
  else
    fail "build --from-env: the $kind environment became a pool" "$(tail -n 5 <<< "$out")"; finish
  fi
  about=$("$SW" inspect --no-check "$E/pools/$name/1.sqfs")
  assert_match "inspect ($kind): kind, Python version, packages, files, interpreter" "Python environment: $kind \(Python 3\.[0-9]+\.[0-9]+\), [0-9]+ packages, [0-9]+ files$from" "$about"
}
build_env sci "$ENV" venv ", interpreter included from $PY"
[[ -n $UVENV ]] && build_env sciuv "$UVENV" uv ", interpreter included from $MANAGED/bin/python$pyv"
build_env scicon "$CONDA" conda ""
"$SW" keygen -q --out "$W/keys/adm" >/dev/null
cp "$W/keys/adm.pub.pem" "$W/trusted/site-admin.pem"
for p in sci sciuv scicon; do
  [[ -f $E/pools/$p/1.sqfs ]] && "$SW" sign -q --key "$W/keys/adm.pem" "$E/pools/$p/1.sqfs"
done
chmod -R a+rX "$W" "$E"
# the original trees: unreadable to the user who loads the pools
chmod 0700 "$ENV" "$UVHOME" "$W/conda"
[[ -n $UVENV ]] && chmod 0700 "$UVENV"
pools="sci scicon"
[[ -n $UVENV ]] && pools="sci sciuv scicon"
# what no import from a pool may open or look up: every original tree and the system's stdlib
forbidden="$ENV|$UVHOME|$W/sci-uv|$W/conda|$stdlib"

cat > "$W/job.sh" <<EOS
#!/bin/bash
set -e
source /usr/share/lmod/lmod/init/bash
export PATH=$W/bin:\$PATH SW_POOL_PATH=$TB/shared/t83-$$/pools SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
export SW_POOL_TRUSTED_KEYS=$W/trusted
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH
for t in $ENV/bin/python $UVHOME/.local $W/conda/envs; do [ -r \$t ] && echo "ORIGINAL READABLE \$t" || echo "original unreadable \$t"; done
for p in $pools; do
  code=\$(srun-mpi -N4 --ntasks-per-node=1 sw-pool load --require-signature \$p/1)
  eval "\$code"
  P=\$p srun -n4 -N4 --ntasks-per-node=1 bash -c 'source /usr/share/lmod/lmod/init/bash; module load \$P/1 && t=\$(mktemp /tmp/t83-trace.XXXXXX) && strace -f -qq -e trace=%file -o "\$t" python -c "import scipy.stats, scipy; print(scipy.__version__)" | sed "s/^/scipy \$P \$(hostname) /" && echo "touches \$P \$(hostname) \$(grep -cE "\"($forbidden)[/\"]" "\$t")" && echo "pool \$P \$(hostname) \$(grep -c "\"/tmp/sw-pool-$uid/" "\$t")"; echo "prefix \$P \$(hostname) \${VIRTUAL_ENV:-\$CONDA_PREFIX}"; rm -f "\$t"'
  code=\$(srun --mpi=pmix -n4 -N4 --ntasks-per-node=1 sw-pool unload \$p/1)
  eval "\$code"
done
EOS
chmod 755 "$W/job.sh"
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=1 -o "$W/out/job-%j.out" --chdir=/tmp "$W/job.sh")
wait_job "$jid" 3000
out=$(cat "$W/out/job-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job: /' | head -60
assert_eq "job: the original environments are unreadable to $TB_USER" 3 "$(grep -c "^original unreadable" <<< "$out" || true)"
for p in $pools; do
  for n in "${nodes[@]}"; do
    assert_eq "$p, $n: import scipy.stats from the loaded pool prints scipy's version" 1 "$(grep -cx "scipy $p $n $want" <<< "$out" || true)"
    assert_eq "$p, $n: nothing under the original trees or $stdlib was opened or looked up (strace)" 1 "$(grep -cx "touches $p $n 0" <<< "$out" || true)"
    assert_match "$p, $n: the trace saw python open files in the mounted pool" "pool $p $n [1-9][0-9]+" "$out"
    assert_eq "$p, $n: VIRTUAL_ENV / CONDA_PREFIX is the package in the mounted pool" 1 "$(grep -cx "prefix $p $n /tmp/sw-pool-$uid/mnt/$p/1/install/$p/1" <<< "$out" || true)"
  done
done
finish
