#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm launcher's tests and for trying
# `areal train --launcher slurm` without a real cluster: munged, slurmctld and slurmd, all as root,
# state under $AREAL_SLURM_DIR (default /tmp/areal-slurm). Needs root (apt, daemons).
#
#   tests/cluster/slurm_local.sh start   # install if missing, configure, start, wait for idle
#   tests/cluster/slurm_local.sh stop    # stop the daemons (the state directory stays)
#   tests/cluster/slurm_local.sh status  # sinfo
#
# Clients (sbatch, srun, sinfo) find the config through /etc/slurm/slurm.conf, linked to ours
# when no other config is there; otherwise `export SLURM_CONF=$AREAL_SLURM_DIR/slurm.conf`.
# The traps this works around are in docs/scale-out-slurm.md.
set -euo pipefail

DIR=${AREAL_SLURM_DIR:-/tmp/areal-slurm}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)
export SLURM_CONF=$CONF

log() { echo "slurm_local: $*" >&2; }
die() { log "error: $*"; exit 1; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm is not installed and installing it needs root"
    log "installing slurm-wlm and munge (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed (is the Debian mirror reachable?)"
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
}

write_config() {
    mkdir -p "$DIR"/{state,spool,log}
    local cpus mem
    cpus=$(nproc)
    # slurmd refuses a node whose RealMemory is above what it measures: leave a margin.
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    cat > "$CONF" <<CONF
# Written by tests/cluster/slurm_local.sh: one node, everything as root, no cgroups.
ClusterName=areal-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
# A job asking for more nodes than the partition has is refused, not left pending forever.
EnforcePartLimits=ALL
SlurmctldPort=${AREAL_SLURMCTLD_PORT:-6817}
SlurmdPort=${AREAL_SLURMD_PORT:-6818}
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$HOST CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
    mkdir -p /etc/slurm
    if [ ! -e /etc/slurm/slurm.conf ] || [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        ln -sfn "$CONF" /etc/slurm/slurm.conf
    else
        log "/etc/slurm/slurm.conf is someone else's: export SLURM_CONF=$CONF for the clients"
    fi
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then  # a fresh random key, readable by munge only
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- munged
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    die "munged did not come up (see /var/log/munge/munged.log)"
}

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    install
    write_config
    start_munge
    running "$DIR/slurmctld.pid" || slurmctld || die "slurmctld failed (see $DIR/log/slurmctld.log)"
    running "$DIR/slurmd.pid" || slurmd || die "slurmd failed (see $DIR/log/slurmd.log)"
    local state=""
    for _ in $(seq 120); do
        state=$(sinfo --noheader --nodes="$HOST" --format=%T 2>/dev/null || true)
        case "$state" in
            # slurmctld restores "idle" from its saved state before slurmd has registered: a
            # one-task job step is the proof that the node runs work.
            idle|mixed|allocated)
                if timeout 20 srun --nodes=1 --ntasks=1 --time=1 --job-name=areal-probe true \
                    >/dev/null 2>&1; then
                    log "node $HOST is $state and runs jobs (SLURM_CONF=$CONF)"; return
                fi ;;
            down*|drain*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    die "node $HOST is not idle after 60 s (state: ${state:-none}); see $DIR/log/"
}

stop_one() {
    local pidfile=$1
    running "$pidfile" || return 0
    local pid; pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

stop() {
    scancel --quiet --full --user=root 2>/dev/null || true
    stop_one "$DIR/slurmd.pid"
    stop_one "$DIR/slurmctld.pid"
    log "stopped slurmd and slurmctld (munged stays: other clients may share it)"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) die "usage: $0 start|stop|status" ;;
esac
