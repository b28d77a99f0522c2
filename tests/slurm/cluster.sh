#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for tests/slurm (make slurm-test) and for trying the
# README's sbatch script by hand. Debian's slurm-wlm 22.05 + munge, daemons started without systemd.
#
#   tests/slurm/cluster.sh start    install the packages if missing (apt-get, needs root), write the
#                                   config, start munged + slurmctld + slurmd, wait until the node is idle
#   tests/slurm/cluster.sh stop     stop the daemons this script started (by their pid files)
#   tests/slurm/cluster.sh status   the daemons' pids and `sinfo`; exit 1 if the cluster is not up
#   tests/slurm/cluster.sh env      the line to use the cluster from a shell: eval "$(... env)"
#
# Everything it writes lives under one folder, $GEN_PIPELINE_SLURM_DIR (default /tmp/gen-pipeline-slurm):
# etc/slurm.conf (clients find it through SLURM_CONF), munge/ (key, socket), log/, run/ (pid files),
# ctld/ (slurmctld's state), spool/ (slurmd's). Only the apt-get install touches the system.
#
# Why these settings (slurm-wlm 22.05 as Debian builds it):
# - munge: Debian's slurmd/slurmctld depend on it, and slurm.conf(5) of 22.05 names auth/munge as the
#   only AuthType. The package also ships auth_none.so + cred_none.so, and AuthType=auth/none with
#   CredType=cred/none does run jobs here, but then any local user can act as any other (root
#   included): munged (its own key and socket under the state folder, up in well under a second) it is.
# - AuthInfo=cred_expire=5: a requeued job waits cred_expire + 1 s before it may start again
#   (slurm.conf(5); default 120 s), which would be most of a test's time. Its Reason=BeginTime is
#   only cleared by the main scheduling loop (sched_interval, default 60 s): 1 s here, and
#   bf_interval=1 (default 30 s), so a requeued task starts about a second after it may.
# - ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroup or systemd needed (containers).
# - Gres=gpu:32 without device files: the docs' sbatch script asks --gpus-per-node=8; four array tasks fit
#   on this one node as they would on four GPU nodes (nothing here touches a GPU).
# - OverSubscribe=FORCE:8 on the partition: 2 CPUs here, yet all ranks of a test run at once.
# - ReturnToService=2, JobRequeue=1, MinJobAge=3600 (a finished job stays in `scontrol show job`).
#
# Exit codes: 0 up (or stopped), 3 cannot start or install (not root, no apt-get, install failed),
# 4 a daemon did not come up (its log's last lines are printed), 1 `status` of a cluster that is down.
set -euo pipefail

STATE=${GEN_PIPELINE_SLURM_DIR:-/tmp/gen-pipeline-slurm}
CTLD_PORT=${GEN_PIPELINE_SLURM_PORT:-6817}   # slurmd listens on the next port
NODE=$(hostname -s)
CONF=$STATE/etc/slurm.conf
START_TIMEOUT_S=60
CRED_EXPIRE_S=5

say() { echo "cluster.sh: $*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; }
now_s() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }
pid_of() { [[ -s $STATE/run/$1.pid ]] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null && cat "$STATE/run/$1.pid"; }

need_install() {
    local cmd
    for cmd in munged slurmctld slurmd sbatch; do
        command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || return 0
    done
    return 1
}

install_packages() {
    command -v apt-get >/dev/null || die 3 "SLURM is not installed and there is no apt-get here: install slurmctld, slurmd, slurm-client and munge (slurm-wlm 22.05 or later)."
    local t0 pkgs=(slurmctld slurmd slurm-client munge) policy=/usr/sbin/policy-rc.d added_policy=0
    t0=$(now_s)
    # Debian's maintainer scripts would start the system's munge/slurm services; we start our own.
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1; fi
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confdef "${pkgs[@]}")
    if ! "${apt[@]}" >"$STATE/log/apt.log" 2>&1; then
        apt-get update -q >>"$STATE/log/apt.log" 2>&1 || true   # a stale package list: refresh once, retry
        "${apt[@]}" >>"$STATE/log/apt.log" 2>&1 || { ((added_policy)) && rm -f "$policy"; tail -n 15 "$STATE/log/apt.log" >&2
            die 3 "apt-get install ${pkgs[*]} failed (log: $STATE/log/apt.log)."; }
    fi
    ((added_policy)) && rm -f "$policy"
    say "installed ${pkgs[*]} in $(since "$t0") s"
}

write_config() {
    local mem_mb
    mem_mb=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
    cat >"$CONF" <<EOF
# written by tests/slurm/cluster.sh for a single-node test cluster; see the comments there
ClusterName=genpipeline
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket,cred_expire=$CRED_EXPIRE_S
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
MinJobAge=3600
KillWait=30
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem_mb Gres=gpu:32 State=UNKNOWN
PartitionName=main Nodes=$NODE Default=YES MaxTime=INFINITE OverSubscribe=FORCE:8 State=UP
EOF
    # slurmd drops a GPU without a device file; empty files stand in (task/none never opens them)
    mkdir -p "$STATE/dev" && touch "$STATE"/dev/gpu{0..31}
    printf 'NodeName=%s Name=gpu File=%s/dev/gpu[0-31]\n' "$NODE" "$STATE" >"$STATE/etc/gres.conf"
}

start_munge() {
    [[ -n $(pid_of munged) ]] && return
    if [[ ! -s $STATE/munge/munge.key ]]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$STATE/munge/munge.key"
    fi
    /usr/sbin/munged --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" >>"$STATE/log/munged.log" 2>&1 \
        || { tail -n 5 "$STATE/log/munged.log" >&2; die 4 "munged did not start (log: $STATE/log/munged.log)."; }
}

start_daemon() {  # name, command...
    local name=$1; shift
    [[ -n $(pid_of "$name") ]] && return
    "$@" >>"$STATE/log/$name.out" 2>&1 || {
        tail -n 10 "$STATE/log/$name.log" "$STATE/log/$name.out" >&2 2>/dev/null
        die 4 "$name did not start (log: $STATE/log/$name.log)."; }
}

wait_idle() {
    local t0 state=""
    t0=$(now_s)
    while :; do
        state=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null || true)
        [[ $state == idle || $state == mixed || $state == allocated ]] && return 0
        if [[ $state == drain* || $state == inval* || $state == down* ]]; then  # it will not heal by itself
            tail -n 10 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 2>/dev/null
            die 4 "node $NODE is $state: $(scontrol show node "$NODE" | grep -o 'Reason=.*')"
        fi
        for d in slurmctld slurmd; do
            [[ -n $(pid_of "$d") ]] || { tail -n 10 "$STATE/log/$d.log" >&2 2>/dev/null; die 4 "$d exited (log: $STATE/log/$d.log)."; }
        done
        if awk -v a="$t0" -v b="$(now_s)" -v t="$START_TIMEOUT_S" 'BEGIN { exit !(b - a > t) }'; then
            tail -n 10 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 2>/dev/null
            die 4 "node $NODE is not idle after ${START_TIMEOUT_S} s (sinfo says '${state:-nothing}')."
        fi
        sleep 0.2  # polling the controller, not waiting for time to pass
    done
}

cmd_start() {
    local t0
    t0=$(now_s)
    [[ $(id -u) == 0 ]] || die 3 "not root (uid $(id -u)): this cluster runs slurmctld and slurmd as root (SlurmUser=root; slurmd starts the jobs) and installs them with apt-get."
    mkdir -p "$STATE"/{etc,munge,log,run,ctld,spool}
    chmod 0755 "$STATE/munge"  # munged: its socket's folder must be searchable by all
    need_install && install_packages
    export PATH=$PATH:/usr/sbin SLURM_CONF=$CONF
    if [[ -n $(pid_of slurmctld) && -n $(pid_of slurmd) ]] && sinfo -h >/dev/null 2>&1; then
        say "already up ($STATE)"; return 0
    fi
    write_config
    start_munge
    # -c: forget the state of an earlier run of this folder (jobs, a drained node); -N: the node's name
    start_daemon slurmctld slurmctld -f "$CONF" -c
    start_daemon slurmd slurmd -f "$CONF" -N "$NODE"
    wait_idle
    say "up in $(since "$t0") s: node $NODE idle; export SLURM_CONF=$CONF"
}

cmd_stop() {
    local d pid
    for d in slurmd slurmctld munged; do
        pid=$(pid_of "$d" || true)
        [[ -n $pid ]] || continue
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        rm -f "$STATE/run/$d.pid"
    done
    say "stopped ($STATE)"
}

cmd_status() {
    local d up=0
    for d in munged slurmctld slurmd; do
        echo "$d: $(pid_of "$d" || echo 'not running')"
    done
    [[ -n $(pid_of slurmctld) && -n $(pid_of slurmd) ]] && up=1
    ((up)) && SLURM_CONF=$CONF sinfo -N
    ((up))
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env   (state folder: \$GEN_PIPELINE_SLURM_DIR, now $STATE)" >&2; exit 2 ;;
esac
