# shellcheck shell=bash disable=SC2034
# Common settings of the sw-pool virtual cluster ("testbed").  Source it:
#   . /work/main/testbed/env.sh          (or $TB/bin/env.sh, a copy visible inside the nodes)
# It defines TB, TB_NODES (space-separated node names of the running testbed), SLURM_CONF,
# and the functions node_ip, node_ns, node_name and tbexec.  It never changes the machine.

TB=/var/tmp/swp-tb                    # all state (NOT under /tmp: every node has a private /tmp)
TB_HOME_BASE=/var/tmp/swp-tb-home     # home of the unprivileged test user (survives --purge)
TB_USER=swuser
TB_USER2=swuser2                      # a second user (two users sharing a node)
TB_NET=10.79.0                        # /24: .1 root ns (login + slurmctld), .2 storage, .11.. nodes
TB_CIDR=$TB_NET.0/24
TB_CTL=swpctl
TB_CTL_IP=$TB_NET.1
TB_STOR=swp-stor                      # storage-server network namespace
TB_STOR_IP=$TB_NET.2
TB_BR=br-swp
TB_MAX_NODES=8
TB_SLURMCTLD_PORT=7917
TB_SLURMD_PORT=7918
TB_HOSTS_BEGIN='# BEGIN swp-testbed'
TB_HOSTS_END='# END swp-testbed'
SLURM_CONF=$TB/etc/slurm.conf
export SLURM_CONF

# The nodes of the running testbed (written by `up`); default node1..node4.
if [[ -r $TB/run/nodes ]]; then
  TB_NODES=$(<"$TB/run/nodes")
else
  TB_NODES="node1 node2 node3 node4"
fi

# node_name ARG: "3" or "node3" -> node3 (1..8); returns 2 on anything else
node_name() {
  local a=${1:-}
  a=${a#node}
  [[ $a =~ ^[1-8]$ ]] || { echo "testbed: not a node name: '${1:-}' (node1..node$TB_MAX_NODES or 1..$TB_MAX_NODES)" >&2; return 2; }
  echo "node$a"
}
# node_ns node3 -> swp-n3 (network namespace name)
node_ns() { echo "swp-n${1#node}"; }
# node_ip node3 -> 10.79.0.13
node_ip() { echo "$TB_NET.$((10 + ${1#node}))"; }

# tbexec NODE CMD...: run CMD inside the node's network, mount and UTS namespaces, with the
# node environment (LOCAL_TMPDIR, SCRATCH, SLURM_CONF).  The working directory is kept
# when it exists on the node too (not for the node-private /tmp, /dev/shm, local dir, and the
# directories hidden on the nodes).
tbexec() {
  local n wd=$PWD
  n=$(node_name "${1:-}") || return 2
  shift
  [[ $# -gt 0 ]] || { echo "tbexec: no command" >&2; return 2; }
  [[ -e /run/netns/$(node_ns "$n") && -e $TB/ns/$n.mnt ]] || { echo "tbexec: $n is not up" >&2; return 3; }
  case $wd in
    /tmp|/tmp/*|/dev/shm|/dev/shm/*|"$TB/local"|"$TB/local/"*|"$TB/nodes"|"$TB/nodes/"*|"$TB/export"|"$TB/export/"*) wd=/ ;;
  esac
  nsenter --net="/run/netns/$(node_ns "$n")" --mount="$TB/ns/$n.mnt" --uts="$TB/ns/$n.uts" --wd="$wd" -- \
    env LOCAL_TMPDIR="$TB/local" SCRATCH="$TB/shared" SLURM_CONF="$SLURM_CONF" "$@"
}
