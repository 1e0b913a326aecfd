#!/usr/bin/env bash
# Bring up a SLURM cluster on this one machine for ftq's `slurm` tests (run as root; idempotent).
#
# Two slurmd daemons stand in for two nodes: NodeName=$(hostname) and NodeName=localhost, both at
# 127.0.0.1 on different ports (Debian's build has no --enable-multiple-slurmd, but it allows this as
# long as each node has its own NodeHostname; both names resolve to this host, so a batch script's
# MASTER_ADDR from `scontrol show hostnames` is reachable from either "node"). That is how a real
# 2-node launch (one `accelerate launch` per node from `srun --ntasks-per-node=1`) is rehearsed here.
#
# Quick when already up: `scontrol ping` plus `sinfo` answering, nothing else is touched.
# Environment: FTQ_SLURM_DIR (state, spool, logs; default /tmp/ftq-slurm), FTQ_SLURM_FORCE=1 (rewrite
# the config and restart the daemons even if the cluster answers).
set -euo pipefail

SLURM_DIR=${FTQ_SLURM_DIR:-/tmp/ftq-slurm}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CTLD_PORT=6817
NODE_PORTS=(6818 6819)

say() { printf 'slurm-setup: %s\n' "$*"; }
die() { printf 'slurm-setup: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts munged/slurmctld/slurmd)"
getent hosts "$HOST" >/dev/null || die "this host's name $HOST does not resolve (add it to /etc/hosts)"
# The second "node" needs another name for this host (a node name is what MASTER_ADDR becomes).
SECOND=
for name in localhost localhost4 ip6-localhost localhost.localdomain; do
    if [ "$name" != "$HOST" ] && getent hosts "$name" >/dev/null; then SECOND=$name; break; fi
done
[ -n "$SECOND" ] || die "no second name resolves to this host (tried localhost, localhost4, ip6-localhost)"

cluster_ready() {
    scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
    # Both nodes answer and none is down/drained.
    local states
    states=$(sinfo --noheader --Node --format='%N %t' 2>/dev/null) || return 1
    [ "$(printf '%s\n' "$states" | grep -cE ' (idle|mix|alloc)\*?$' || true)" -ge 2 ] || return 1
    ! printf '%s\n' "$states" | grep -qE ' [a-z]+\*$'
}

if [ "${FTQ_SLURM_FORCE:-0}" != 1 ] && command -v scontrol >/dev/null && cluster_ready; then
    say "already up: $(sinfo --noheader --Node --format='%N:%t' | tr '\n' ' ')"
    exit 0
fi

# 1. Packages --------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt may be running (other setup scripts): wait for the lock rather than fail.
    apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null \
        || die "apt-get update failed (no network to the Debian mirror?)"
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
fi
command -v slurmctld >/dev/null || die "slurmctld not found after install"

# 2. munge -----------------------------------------------------------------------------------------
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    say "creating the munge key"
    mungekey -c -f -k /etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    # A munged that left its pid file but does not answer: stop it before starting a fresh one.
    if [ -s /run/munge/munged.pid ]; then kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
    runuser -u munge -- /usr/sbin/munged --force \
        || die "munged did not start (see /var/log/munge/munged.log)"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null 2>&1 || die "munge does not answer (see /var/log/munge/munged.log)"
fi

# 3. slurm.conf ------------------------------------------------------------------------------------
CPUS=$(nproc)
MEM_MB=$(free -m | awk '/^Mem:/ {print int($2 * 0.9)}')
mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/log" /etc/slurm
for n in "$HOST" "$SECOND"; do mkdir -p "$SLURM_DIR/spool-$n"; done

cat >"$CONF.new" <<EOF
# Written by ftq's .ci/slurm-setup.sh: a test cluster of two "nodes" on one machine.
ClusterName=ftq
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs leave squeue after a few seconds: the launcher learns their end from exit_status.
MinJobAge=5
ReturnToService=2
SlurmdTimeout=60
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${NODE_PORTS[0]} CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=$SECOND NodeHostname=$SECOND NodeAddr=127.0.0.1 Port=${NODE_PORTS[1]} CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST,$SECOND Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
mv "$CONF.new" "$CONF"

# 4. Daemons ---------------------------------------------------------------------------------------
stop_pidfile() {
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$f"
}
stop_pidfile "$SLURM_DIR/slurmctld.pid"
for n in "$HOST" "$SECOND"; do stop_pidfile "$SLURM_DIR/slurmd-$n.pid"; done

say "starting slurmctld and slurmd ($HOST, $SECOND): CPUs=$CPUS RealMemory=${MEM_MB}MB"
# -i: ignore state saved by an earlier cluster with another config (no stale nodes or jobs).
slurmctld -i || die "slurmctld did not start: $(tail -5 "$SLURM_DIR/log/slurmctld.log" 2>/dev/null)"
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping | grep -q 'is UP' || die "slurmctld does not answer: $(tail -5 "$SLURM_DIR/log/slurmctld.log")"
for n in "$HOST" "$SECOND"; do
    slurmd -N "$n" || die "slurmd -N $n did not start: $(tail -5 "$SLURM_DIR/log/slurmd-$n.log" 2>/dev/null)"
done

for _ in $(seq 150); do cluster_ready && break; sleep 0.2; done
if ! cluster_ready; then
    sinfo -N -l >&2 || true
    tail -20 "$SLURM_DIR/log/slurmctld.log" >&2 || true
    die "nodes did not become idle"
fi
timeout 60 srun -N1 hostname >/dev/null || die "srun -N1 hostname did not answer"
timeout 60 srun -N2 --ntasks-per-node=1 hostname >/dev/null || die "srun -N2 hostname did not answer"
say "up: $(sinfo --noheader --Node --format='%N:%t' | tr '\n' ' ')"
