#!/usr/bin/env bash
# The README's cluster examples, run as written (issue 32, point 5): the paper's two command lines
# (`paper`), the batch script that loads a pool by name and uses its module on every node (`job`),
# and the one that syncs a layer to every node and runs a tool from it (`job-layer`). Each block is
# taken from README.md by tools/readme-example. What `make install` gives a login shell (sw-pool on
# PATH, its shell function, Lmod) and a site's pool_path are set up around the batch scripts; their
# #SBATCH lines become sbatch's options.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (make build)"; finish; }
uid=$(id -u "$TB_USER")
W=$TB/scratch/t70-$$
E=$TB/export/t70-$$          # the storage server's disk; nodes see it as $TB/shared/t70-$$
LD=$TB/local/t70-layers-$uid # node-local layer directory
cleanup() {
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && (\$2 ~ \"^$TB/local/t70\" || \$2 ~ \"^/tmp/sw-pool-$uid/\") {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\" || umount -l \"\$m\"; done; rm -rf $TB/local/t70* /tmp/sw-pool-$uid" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E"
  rm -f "$TB/shared/t70-$$"
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$W/out" "$E/pools/demo" "$W/tree"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool
printf '#!/bin/sh\nexec %q "$@"\n' "$TESTBED/mpirun" > "$W/bin/mpirun"
chmod 755 "$W/bin/mpirun"

# --- paper: the two command lines, verbatim, as root (mpirun is the testbed's launcher)
mkdir -p "$W/test-pool" "$E/paper"
head -c 8MB /dev/urandom > "$W/test-pool/random.data"
"$SW" build -q -s 40MB "$E/paper/random.ext2" "$W/test-pool" >/dev/null
# the block signs $SCRATCH/random.ext2 where it runs (here: the host, a login node): the host sees
# the storage server's disk under the nodes' path too (a link; the nodes' sshfs mount hides it)
ln -sfn "$E" "$TB/shared/t70-$$"
# under the quick start's trust policy: its key (me.pem in the working directory) is trusted
"$SW" keygen -q --out "$W/me" >/dev/null
mkdir -p "$W/keys" && cp "$W/me.pub.pem" "$W/keys/me.pem"
bash "$REPO/tools/readme-example" paper > "$W/paper.sh"
for n in "${nodes[@]}"; do "$TESTBED/exec" "$n" mkdir -p "$TB/local/t70"; done   # a job's $LOCAL_TMPDIR exists
rc=0
out=$(cd "$W" && env PATH="$W/bin:$PATH" LOCAL_TMPDIR="$TB/local/t70" SCRATCH="$TB/shared/t70-$$/paper" \
  SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh SW_POOL_TRUSTED_KEYS="$W/keys" \
  bash -e "$W/paper.sh" 2>&1) || rc=$?
assert_eq "README paper block: both command lines exit 0" 0 "$rc"
assert_eq "README paper block: the 1020MB ext2 pool was built" 1 "$(stat -c %s "$W/test-pool.ext2" 2>/dev/null | awk '{print ($1 > 1020000000)}')"
assert_match "README paper block: -v load prints its phases" "mount +[0-9.]+ s" "$out"
for n in "${nodes[@]}"; do
  assert_eq "README paper block: $n has the pool mounted at \$LOCAL_TMPDIR/mnt" 1 \
    "$("$TESTBED/exec" "$n" sh -c "grep -c ' $TB/local/t70/mnt fuse' /proc/self/mounts || true")"
done
env PATH="$W/bin:$PATH" "$TESTBED/mpirun" "$SW" unload "$TB/local/t70/mnt" >/dev/null 2>&1 || true
[[ $rc == 0 ]] || printf '  %s\n' "$(tail -n 20 <<< "$out")"

# --- the site's pool demo/1.0 with hello/1.0, on shared storage (pool_path)
"$SW" init -q --version 1.0 "$W/tree/demo" >/dev/null
mkdir -p "$W/tree/demo/install/hello/1.0/bin"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' > "$W/tree/demo/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/demo/install/hello/1.0/bin/hello"
"$SW" build -q --gen-modulefiles "$E/pools/demo/1.0.sqfs" "$W/tree/demo"
chmod -R a+rX "$W" "$E"

# a batch script from a README block: what a login shell has after `make install` (sw-pool and its
# shell function, Lmod) and the site's configuration, then the block (its #SBATCH lines: options)
job_from_readme() {  # job_from_readme KIND SCRIPT
  {
    echo '#!/bin/bash'
    echo "export PATH=$W/bin:\$PATH SW_POOL_PATH=$TB/shared/t70-$$/pools SW_POOL_LAYER_DIR=$LD SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG="
    echo 'unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH'
    echo 'source /usr/share/lmod/lmod/init/bash'
    echo 'eval "$(sw-pool shell-init bash)"'
    echo 'set -e'
    bash "$REPO/tools/readme-example" "$1" | grep -v '^#!'
    echo 'echo README-JOB-DONE'
  } > "$2"
  chmod 755 "$2"
}
run_job() {  # run_job SCRIPT KIND -> the job's output
  local opts jid
  read -r -a opts <<< "$(bash "$REPO/tools/readme-example" "$2" | sed -n 's/^#SBATCH //p' | tr '\n' ' ')"
  jid=$(as_user sbatch --parsable "${opts[@]}" -o "$W/out/$2-%j.out" --chdir=/tmp "$1")
  wait_job "$jid" 3000
  cat "$W/out/$2-$jid.out" 2>/dev/null || true
}

# --- job: load by name, module load, srun on every node, unload
job_from_readme job "$W/job.sh"
out=$(run_job "$W/job.sh" job)
assert_match "README job block ran to its end" "README-JOB-DONE" "$out"
for n in "${nodes[@]}"; do
  assert_eq "README job block: srun hello ran both tasks on $n" 2 "$(grep -c "^hello from $n\$" <<< "$out" || true)"
done
assert_eq "README job block: sw-pool list shows one mount on each of the 4 nodes" 4 "$(grep -cE 'ok +demo/1\.0 ' <<< "$out" || true)"
for n in "${nodes[@]}"; do
  assert_eq "README job block: nothing left mounted on $n" 0 \
    "$("$TESTBED/exec" "$n" sh -c "grep -c ' /tmp/sw-pool-$uid/' /proc/self/mounts || true")"
done
grep -q README-JOB-DONE <<< "$out" || printf '  job: %s\n' "$(tail -n 25 <<< "$out")"

# --- the README's job script of "The shell function" (#!/bin/bash, no -l) under sbatch: the
# function the submitting shell exported (sbatch passes its environment) loads the pool in the
# script's own shell; the log gets hello's output, no shell code. Submitted from a shell without
# the function, the same script's load refuses (its output is the log) and mounts nothing.
bash "$REPO/tools/readme-example" session | sed -n "/^cat > job.sh <<'EOF'\$/,/^EOF\$/p" | sed '1d;$d' > "$W/fn-job.sh"
chmod 755 "$W/fn-job.sh"
assert_eq "README job script: #!/bin/bash, not a login shell" '#!/bin/bash' "$(head -n 1 "$W/fn-job.sh")"
submit_fn_job() {  # submit_fn_job TAG SETUP -> the job's log
  local jid
  jid=$(as_user env -u XDG_RUNTIME_DIR -u SW_POOL_STATE_DIR -u MODULEPATH bash -c "export PATH=$W/bin:\$PATH SW_POOL_PATH=$TB/shared/t70-$$/pools SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=; source /usr/share/lmod/lmod/init/bash; $2; sbatch --parsable -N1 -o $W/out/fn-$1-%j.out --chdir=/tmp $W/fn-job.sh")
  wait_job "$jid" 3000
  cat "$W/out/fn-$1-$jid.out" 2>/dev/null || true
}
out=$(submit_fn_job with 'eval "$(sw-pool shell-init bash)"')
assert_match "README job script under sbatch (no -l): hello ran, the function loaded the pool" "hello from node" "$out"
assert_eq "... its log holds no shell code (export, MODULEPATH)" 0 "$(grep -cE '^export |MODULEPATH' <<< "$out" || true)"
grep -q 'hello from node' <<< "$out" || printf '  fn-job: %s\n' "$(tail -n 15 <<< "$out")"
out=$(submit_fn_job without 'true')
assert_match "... submitted without the function: load refuses, naming the line to use" 'nothing was mounted.*eval' "$out"
assert_eq "... and writes no shell code into the log" 0 "$(grep -cE '^export ' <<< "$out" || true)"
for n in "${nodes[@]}"; do
  assert_eq "README job script: nothing left mounted on $n" 0 \
    "$("$TESTBED/exec" "$n" sh -c "grep -c ' /tmp/sw-pool-$uid/' /proc/self/mounts || true")"
done

# --- job-layer: a layer with a tool, synced to every node and run there
rc=0
out=$(as_user env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_LAYER_DIR="$LD" srun -N1 -w "${nodes[0]}" --chdir="$W" \
  sh -c "$SW layer create dev >/dev/null && $SW run --layer dev -- sh -c 'printf \"#!/bin/sh\\necho mytool on \\\$(hostname)\\n\" > /usr/local/bin/mytool && chmod 755 /usr/local/bin/mytool'" 2>&1) || rc=$?
assert_eq "a layer dev with /usr/local/bin/mytool on ${nodes[0]}" 0 "$rc"
job_from_readme job-layer "$W/job-layer.sh"
out=$(run_job "$W/job-layer.sh" job-layer)
assert_match "README job-layer block ran to its end" "README-JOB-DONE" "$out"
for n in "${nodes[@]}"; do
  assert_match "README job-layer block: mytool from the synced layer on $n" "mytool on $n" "$out"
done
grep -q README-JOB-DONE <<< "$out" || printf '  job-layer: %s\n' "$(tail -n 25 <<< "$out")"
finish
