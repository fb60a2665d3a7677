#!/usr/bin/env bash
# stop-slurm.sh - stop exactly the daemons start-slurm.sh started, through their pid files
# under $KIT_DIR/run/pid. Never kills by name; checks /proc/<pid>/comm first (pid reuse).
#   --slurm-only   leave munged running (config change restarts)
set -uo pipefail
: "${KIT_DIR:?KIT_DIR must be set}"
PIDS=$KIT_DIR/run/pid

running() { [ -r /proc/$1/stat ] && [ "$(awk '{print $3}' /proc/$1/stat 2>/dev/null)" != Z ]; }

stop_pid() { # stop_pid <pidfile> <comm>
  local f=$1 comm=$2 p
  [ -s "$f" ] || return 0
  p=$(cat "$f")
  if ! running "$p" || [ "$(cat /proc/$p/comm 2>/dev/null)" != "$comm" ]; then
    echo "$comm: pid $p not running (stale pid file)"; rm -f "$f"; return 0
  fi
  kill -TERM "$p"
  for i in $(seq 100); do running "$p" || break; sleep 0.1; done
  if running "$p" && [ "$(cat /proc/$p/comm 2>/dev/null)" = "$comm" ]; then
    echo "$comm: pid $p ignored SIGTERM, sending SIGKILL"; kill -KILL "$p"
  fi
  rm -f "$f"; echo "$comm: stopped pid $p"
}

stop_pid "$PIDS/slurmd.pid" slurmd
stop_pid "$PIDS/slurmctld.pid" slurmctld
[ "${1:-}" = "--slurm-only" ] || stop_pid "$PIDS/munged.pid" munged
exit 0
