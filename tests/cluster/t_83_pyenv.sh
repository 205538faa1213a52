#!/usr/bin/env bash
# A Python environment as a pool: a venv over the system python3 with numpy + scipy from the package
# registry (wheels cached under target/tmp/pyenv-wheels), built with `sw-pool build --from-env`,
# signed, loaded on 4 nodes as the unprivileged user inside a Slurm job with the original tree made
# unreadable to that user; `module load` + `python -c 'import scipy.stats'` works on every node and
# strace shows no access to the original environment or the system's standard library.
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
mkdir -p "$W/bin" "$W/keys" "$W/trusted" "$W/out" "$E/pools/sci"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$REPO/tests/cluster/srun-mpi" "$W/bin/"
SW=$W/bin/sw-pool

# --- the environment: /usr/bin/python3 -m venv, numpy + scipy from the registry (or the cache)
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

if out=$("$SW" build -q --from-env "$ENV" --name sci --version 1 "$E/pools/sci/1.sqfs" 2>&1); then
  pass "build --from-env: the venv (scipy $want) became a pool"
else
  fail "build --from-env: the venv became a pool" "$(tail -n 5 <<< "$out")"; finish
fi
about=$("$SW" inspect --no-check "$E/pools/sci/1.sqfs")
assert_match "inspect: kind, Python version, packages, files" "Python environment: venv \(Python 3\.[0-9]+\.[0-9]+\), [0-9]+ packages, [0-9]+ files, interpreter included from $PY" "$about"
"$SW" keygen -q --out "$W/keys/adm" >/dev/null
cp "$W/keys/adm.pub.pem" "$W/trusted/site-admin.pem"
"$SW" sign -q --key "$W/keys/adm.pem" "$E/pools/sci/1.sqfs"
chmod -R a+rX "$W" "$E"
# the original tree: unreadable to the user who loads the pool
chmod 0700 "$ENV"

cat > "$W/job.sh" <<EOS
#!/bin/bash
set -e
source /usr/share/lmod/lmod/init/bash
export PATH=$W/bin:\$PATH SW_POOL_PATH=$TB/shared/t83-$$/pools SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
export SW_POOL_TRUSTED_KEYS=$W/trusted
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH
[ -r $ENV/bin/python ] && echo "ORIGINAL READABLE" || echo "original unreadable"
code=\$(srun-mpi -N4 --ntasks-per-node=1 sw-pool load --require-signature sci/1)
eval "\$code"
srun -n4 -N4 --ntasks-per-node=1 bash -c 'source /usr/share/lmod/lmod/init/bash; module load sci/1 && t=\$(mktemp /tmp/t83-trace.XXXXXX) && strace -f -qq -e trace=%file -o "\$t" python -c "import scipy.stats, scipy; print(scipy.__version__)" | sed "s/^/scipy \$(hostname) /" && echo "touches \$(hostname) \$(grep -cE "\"($ENV|$stdlib)[/\"]" "\$t")" && echo "pool \$(hostname) \$(grep -c "\"/tmp/sw-pool-$uid/" "\$t")"; echo "venv \$(hostname) \$VIRTUAL_ENV"; rm -f "\$t"'
code=\$(srun --mpi=pmix -n4 -N4 --ntasks-per-node=1 sw-pool unload sci/1)
eval "\$code"
EOS
chmod 755 "$W/job.sh"
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=1 -o "$W/out/job-%j.out" --chdir=/tmp "$W/job.sh")
wait_for 3000 sh -c "! squeue -h -j $jid 2>/dev/null | grep -q ."
out=$(cat "$W/out/job-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job: /' | head -40
assert_match "job: the original environment is unreadable to $TB_USER" "^original unreadable" "$out"
for n in "${nodes[@]}"; do
  assert_eq "$n: import scipy.stats from the loaded pool prints scipy's version" 1 "$(grep -cx "scipy $n $want" <<< "$out" || true)"
  assert_eq "$n: nothing under $ENV or $stdlib was opened or looked up (strace)" 1 "$(grep -cx "touches $n 0" <<< "$out" || true)"
  assert_match "$n: the trace saw python open files in the mounted pool" "pool $n [1-9][0-9]+" "$out"
  assert_eq "$n: VIRTUAL_ENV is the package in the mounted pool" 1 "$(grep -cx "venv $n /tmp/sw-pool-$uid/mnt/sci/1/install/sci/1" <<< "$out" || true)"
done
finish
