#!/usr/bin/env bash
# Stop what ops/slurm/setup.sh started (the packages stay installed).
for f in /run/slurm/slurmd-*.pid /run/slurm/slurmctld.pid /run/slurm/slurmdbd.pid /run/mysqld/mysqld.pid \
         /run/munge/munged.pid; do
  [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null
done
exit 0
