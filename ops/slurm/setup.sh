#!/usr/bin/env bash
# Install (Debian/Ubuntu packages) and start a single-host Slurm to measure rota against, side by side:
# munge, slurmctld and one slurmd per emulated node (gpu01..gpuNN: 64 CPUs, 257,000 MiB, 8 fake A100s
# each), partitions short (default) and long, no accounting database (jobcomp/filetxt). Run as root.
# Idempotent: daemons already running (by their pid files) are left alone. ops/slurm/stop.sh stops them.
#
#   NODES=4 ops/slurm/setup.sh
#   WITH_DBD=1 ops/slurm/setup.sh     # with accounting (mariadb + slurmdbd): sacctmgr accounts, QOS and limits
#
# Slurm's commands land in /usr/bin: rota's tests and benchmarks call rota's own by path.
set -euo pipefail
NODES=${NODES:-4}
WITH_DBD=${WITH_DBD:-0}
HOST=$(hostname -s)
LAST=$(printf '%02d' "$NODES")
export DEBIAN_FRONTEND=noninteractive

missing=()
pkgs=(slurm-wlm munge)
[ "$WITH_DBD" = 1 ] && pkgs+=(slurmdbd mariadb-server)
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then apt-get install -y -q "${missing[@]}" >/dev/null; fi

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# gres.conf wants device files; fake ones (the NVIDIA driver's major number, else plain files)
for i in 0 1 2 3 4 5 6 7; do
  [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c 195 $i 2>/dev/null || touch /dev/nvidia$i
done

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm /run/slurm
{
cat <<CONF
ClusterName=rotabench
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ReturnToService=1
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
PriorityType=priority/multifactor
GresTypes=gpu
SlurmdParameters=config_overrides
DefMemPerCPU=1024
MaxJobCount=100000
MaxArraySize=10001
MinJobAge=60
KillWait=5
Waittime=0
CONF
if [ "$WITH_DBD" = 1 ]; then
  printf '%s\n' AccountingStorageType=accounting_storage/slurmdbd AccountingStorageHost=localhost \
    AccountingStoragePort=6819 AccountingStorageTRES=gres/gpu JobCompType=jobcomp/none
else
  printf '%s\n' AccountingStorageType=accounting_storage/none JobCompType=jobcomp/filetxt \
    JobCompLoc=/var/log/slurm/jobcomp.log
fi
for i in $(seq 1 "$NODES"); do
  echo "NodeName=$(printf 'gpu%02d' "$i") NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=64 RealMemory=257000 Gres=gpu:a100:8 State=UNKNOWN"
done
echo "PartitionName=short Nodes=gpu[01-$LAST] Default=YES MaxTime=01:00:00 DefaultTime=00:10:00 State=UP"
echo "PartitionName=long Nodes=gpu[01-$LAST] Default=NO MaxTime=7-00:00:00 DefaultTime=01:00:00 State=UP"
} > /etc/slurm/slurm.conf
cat > /etc/slurm/gres.conf <<CONF
AutoDetect=off
NodeName=gpu[01-$LAST] Name=gpu Type=a100 File=/dev/nvidia[0-7]
CONF

mkdir -p /run/munge && chown munge:munge /run/munge
running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid --force
sleep 0.5
munge -n | unmunge >/dev/null

if [ "$WITH_DBD" = 1 ]; then
  # the database password: made here, kept only in root's slurmdbd.conf (never a fixed one other users could read)
  PASS=$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf 2>/dev/null || true)
  [ -n "$PASS" ] || PASS=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
  umask 077
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$PASS
StorageLoc=slurm_acct_db
CONF
  umask 022
  chown slurm:slurm /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! running /run/mysqld/mysqld.pid; then
    runuser -u mysql -- /usr/sbin/mariadbd --pid-file=/run/mysqld/mysqld.pid --socket=/run/mysqld/mysqld.sock \
      --bind-address=127.0.0.1 --innodb-buffer-pool-size=256M >/var/log/slurm/mariadbd.out 2>&1 &
    for _ in $(seq 1 60); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost'; ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$PASS';
              CREATE DATABASE IF NOT EXISTS slurm_acct_db; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  if ! running /run/slurm/slurmdbd.pid; then
    /usr/sbin/slurmdbd
    for _ in $(seq 1 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
  fi
  sacctmgr -i add cluster rotabench >/dev/null 2>&1 || true
fi

if ! running /run/slurm/slurmctld.pid; then
  /usr/sbin/slurmctld
  for _ in $(seq 1 60); do [ -s /run/slurm/slurmctld.pid ] && break; sleep 0.5; done
fi
for i in $(seq 1 "$NODES"); do
  n=$(printf 'gpu%02d' "$i")
  mkdir -p /var/spool/slurmd/$n
  running /run/slurm/slurmd-$n.pid || /usr/sbin/slurmd -N "$n"
done
for _ in $(seq 1 60); do
  [ "$(sinfo -h -o '%t' | sort -u | tr -d '\n')" = idle ] && break
  sleep 1
done
sinfo
