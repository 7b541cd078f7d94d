#!/usr/bin/env bash
# A single-node SLURM cluster on this machine (Debian/Ubuntu packages), to try the SLURM path of
# apps-bench on a workstation and for the tests: munge, slurmctld, slurmd and, for accounting
# (sacct: how a job that ended without a result is told apart), slurmdbd + MariaDB.
#
#   launchers/slurm_local.sh start     # then:  source slurm-local/env
#   python -m apps_bench -m hydra/launcher=slurm seed=0,1 ...
#   launchers/slurm_local.sh stop
#   launchers/slurm_local.sh install   # apt-get slurm-wlm slurmdbd munge mariadb-server, services not started
#
# Needs root and those packages (INSTALL=1 start installs them first).
# Every file (config, state, logs, munge key, database) lives in $SLURM_LOCAL_DIR; nothing under /etc
# is changed. slurmctld and slurmd listen on 127.0.0.1 only (CommunicationParameters=NoInAddrAny,
# NoCtldInAddrAny); MariaDB on 127.0.0.1. slurmdbd always binds 0.0.0.0, so accounting is on only
# inside a private network namespace (ACCOUNTING=auto), e.g.
#   ip netns add slurm && ip netns exec slurm ip link set lo up
#   nsenter --net=/run/netns/slurm unshare --mount   # a shell whose daemons nothing outside can reach
# (the namespace also needs one non-loopback address for slurmdbd, and this host's name mapped to
# 127.0.0.1: see tests/launchers/cluster_env.py). Without accounting apps-bench still ends a sweep whose
# job was cancelled or killed, with a message (it watches squeue, not sacct).
#
# `start` writes $SLURM_LOCAL_DIR/env, which the SLURM preset (conf/hydra/launcher/slurm.yaml) reads:
#   SLURM_CONF                         this cluster's slurm.conf (sbatch, squeue, scancel find it)
#   APPS_BENCH_SLURM_PARTITION         debug
#   APPS_BENCH_SLURM_CPUS_PER_TASK     1      (CPUS_PER_CELL)
#   APPS_BENCH_SLURM_MEM_GB            1      (MEM_GB_PER_CELL; a gold cell uses ~0.45 GB)
#   APPS_BENCH_SLURM_TIMEOUT_MIN       30
#   APPS_BENCH_SLURM_ARRAY_PARALLELISM the node's CPUs / CPUS_PER_CELL
#   APPS_BENCH_SLURM_POLL_S            2      (squeue on a one-node cluster is cheap: ended jobs are seen soon)
#
# Environment: SLURM_LOCAL_DIR (./slurm-local), ACCOUNTING (auto|1|0), CPUS (nproc),
#   MEM_MB (80% of RAM), CPUS_PER_CELL (1), MEM_GB_PER_CELL (1), CLUSTER (apps), PARTITION (debug),
#   SLURMCTLD_PORT (6817), SLURMD_PORT (6818), SLURMDBD_PORT (6819), MARIADB_PORT (3306).
set -euo pipefail
trap 'echo "slurm_local.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

cmd="${1:-}"
D="$(realpath -m "${SLURM_LOCAL_DIR:-$PWD/slurm-local}")"
die() { echo "slurm_local.sh: $*" >&2; exit 2; }
log() { echo "slurm_local.sh: $*" >&2; }

stop() {
  [ -f "$D/pids" ] || { log "nothing to stop in $D"; return 0; }
  # reverse start order, by the PIDs this script recorded (never by name: other clusters may run here)
  local pids; pids=$(tac "$D/pids" | awk '{print $2}')
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.2
  done
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  rm -f "$D/pids"
  log "stopped"
}

bg() {  # bg NAME CMD...: a daemon in the foreground of its own session, its PID recorded
  local name=$1; shift
  setsid "$@" >"$D/log/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$D/pids"
}

wait_for() {  # wait_for WHAT TRIES CMD...
  local what=$1 tries=$2; shift 2
  for _ in $(seq "$tries"); do timeout 10 "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$what did not come up; last log lines:"; tail -n 15 "$D"/log/*.log >&2 || true
  stop; exit 1
}

install() {  # Debian's packages, without starting their system-wide services (policy-rc.d: 101)
  [ "$(id -u)" = 0 ] || die "install needs root (apt-get)"
  local policy=/usr/sbin/policy-rc.d own=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; own=1; fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm slurmdbd munge mariadb-server iproute2 util-linux >/dev/null; } </dev/null || rc=$?
  if [ $own = 1 ]; then rm -f "$policy"; fi
  return $rc
}

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (the daemons run as root, with their files in $D)"
  if [ "${INSTALL:-0}" = 1 ]; then install; fi
  for b in munged slurmctld slurmd sbatch; do
    command -v "$b" >/dev/null || die "$b not found: apt-get install slurm-wlm munge (or INSTALL=1)"
  done
  if [ -f "$D/pids" ]; then
    while read -r name p; do
      tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "$name" \
        && die "already running ($name, pid $p, $D/pids): launchers/slurm_local.sh stop first"
    done <"$D/pids"
  fi
  local acct="${ACCOUNTING:-auto}"
  if [ "$acct" = auto ]; then
    # on only in a private network namespace (slurmdbd binds 0.0.0.0)
    if [ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net)" ]; then acct=1; else acct=0; fi
  fi
  if [ "$acct" = 1 ]; then
    for b in slurmdbd mariadbd mariadb-install-db sacctmgr; do
      command -v "$b" >/dev/null || die "$b not found (accounting): apt-get install slurmdbd mariadb-server, or ACCOUNTING=0"
    done
  fi

  rm -rf "$D"; mkdir -p "$D"/{log,state,spool,mysql,mysqlrun,munge,munge-key}
  rm -f "$D/pids"
  local host cpus mem
  host=$(hostname -s)
  cpus=${CPUS:-$(nproc)}
  mem=${MEM_MB:-$(( $(free -m | awk '/Mem:/{print $2}') * 8 / 10 ))}
  export SLURM_CONF=$D/slurm.conf

  # munge with its own key and socket (a munged of the host, if any, is left alone)
  local sock=$D/munge/munge.sock
  dd if=/dev/urandom of="$D/munge-key/munge.key" bs=1024 count=1 status=none
  chmod 700 "$D/munge-key"; chmod 400 "$D/munge-key/munge.key"; chmod 755 "$D/munge"
  bg munged munged -F --force --socket="$sock" --key-file="$D/munge-key/munge.key" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.file.log" --seed-file="$D/munge/seed"
  wait_for munged 50 test -S "$sock"

  local acct_conf="AccountingStorageType=accounting_storage/none"
  if [ "$acct" = 1 ]; then
    local dbport=${MARIADB_PORT:-3306} pw
    # as root: $D may sit under a directory only root can enter
    mariadb-install-db --user=root --datadir="$D/mysql" --auth-root-authentication-method=socket >"$D/log/mariadb-install.log" 2>&1
    bg mariadb mariadbd --user=root --datadir="$D/mysql" --socket="$D/mysqlrun/mysqld.sock" \
      --pid-file="$D/mysqlrun/mysqld.pid" --bind-address=127.0.0.1 --port="$dbport" --skip-name-resolve
    wait_for mariadb 100 test -S "$D/mysqlrun/mysqld.sock"
    pw=$(head -c 18 /dev/urandom | base64 | tr -dc A-Za-z0-9)
    mariadb --socket="$D/mysqlrun/mysqld.sock" <<SQL
CREATE DATABASE slurm_acct_db; CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
    (umask 077; cat >"$D/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=${SLURMDBD_PORT:-6819}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$dbport
StorageUser=slurm
StoragePass=$pw
PidFile=$D/slurmdbd.pid
LogFile=$D/log/slurmdbd.file.log
EOF
)
    acct_conf="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=${SLURMDBD_PORT:-6819}
AccountingStoragePass=$sock
JobAcctGatherType=jobacct_gather/none"
  fi

  cat >"$SLURM_CONF" <<EOF
ClusterName=${CLUSTER:-apps}
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.file.log
SlurmdLogFile=$D/log/slurmd.file.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
$acct_conf
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=${PARTITION:-debug} Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  if [ "$acct" = 1 ]; then
    bg slurmdbd slurmdbd -D   # reads slurmdbd.conf beside $SLURM_CONF
    wait_for slurmdbd 100 sacctmgr -n list cluster
    sacctmgr -i add cluster "${CLUSTER:-apps}" >/dev/null
  fi
  bg slurmctld slurmctld -D -i -f "$SLURM_CONF"
  bg slurmd slurmd -D -f "$SLURM_CONF"
  wait_for "the node" 150 sh -c "sinfo -h -o %T | grep -q idle"

  local per=${CPUS_PER_CELL:-1}
  cat >"$D/env" <<EOF
export SLURM_CONF=$SLURM_CONF
export APPS_BENCH_SLURM_PARTITION=${PARTITION:-debug}
export APPS_BENCH_SLURM_CPUS_PER_TASK=$per
export APPS_BENCH_SLURM_MEM_GB=${MEM_GB_PER_CELL:-1}
export APPS_BENCH_SLURM_TIMEOUT_MIN=30
export APPS_BENCH_SLURM_ARRAY_PARALLELISM=$(( cpus / per > 0 ? cpus / per : 1 ))
export APPS_BENCH_SLURM_POLL_S=2
EOF
  log "up: partition ${PARTITION:-debug}, node $host ($cpus CPUs, $mem MB), accounting $([ "$acct" = 1 ] && echo on || echo off)"
  echo "source $D/env"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  install) install ;;
  *) die "usage: launchers/slurm_local.sh start|stop|install   (SLURM_LOCAL_DIR=$D)" ;;
esac
