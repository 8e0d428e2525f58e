#!/usr/bin/env bash
# A real S3 server for tests and local runs: a single-node Ceph (one mon, one memstore OSD, no
# mgr, auth none, pool size 1) plus radosgw on 127.0.0.1, everything (config, data, logs, run
# and admin sockets, pids) under one directory. Not for keeping data: memstore lives in RAM.
# Settings, traps and numbers: README.md, "S3 checkpoint store"; ceph-mon(8), ceph-osd(8),
# radosgw(8), radosgw-admin(8), monmaptool(8). Needs node and `npm ci` (create-bucket.mjs).
#
#   scripts/s3/radosgw.sh start DIR   # prints KEY=VALUE lines (also in DIR/env) once S3 answers
#   scripts/s3/radosgw.sh stop DIR    # SIGTERM rgw, osd, mon by their recorded pids; waits
#
# Use: set -a; . DIR/env; set +a   (AWS_ENDPOINT_URL, keys, AWS_REGION, SBX_S3_BUCKET: a
# versioned bucket, sbx-checkpoints unless SBX_S3_BUCKET names another)
# Exit: 0 ok, 1 failed (nothing left running, logs under DIR/log), 2 packages missing or usage.
set -euo pipefail

APT_CMD='apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw'
ACCESS_KEY=SBXTESTACCESSKEY0001
SECRET_KEY=sbx-test-secret-key-0000000000000000000001
BUCKET=${SBX_S3_BUCKET:-sbx-checkpoints}
START_TIMEOUT_S=${RADOSGW_START_TIMEOUT_S:-120}
STOP_TIMEOUT_S=${RADOSGW_STOP_TIMEOUT_S:-30}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { echo "radosgw.sh: $*" >&2; }
usage() { say "usage: radosgw.sh start DIR | radosgw.sh stop DIR"; exit 2; }

[ $# -eq 2 ] || usage
cmd=$1
dir=$(realpath -m -- "$2")
conf=$dir/ceph.conf
pids=$dir/pids

# True while pid is a live (not zombie) process of this directory's: with START (its start time
# as launch recorded it) the process started then, so a pid since reused is never signalled and
# one still exiting (its cmdline already reads empty) is still ours; without (a pids file of an
# older script) one whose cmdline names this directory's config.
ours() {
  local pid=$1 start=${2:-} state
  if [ -n "$start" ]; then
    [ "$(start_time "$pid")" = "$start" ]
    return
  fi
  [ -r "/proc/$pid/cmdline" ] || return 1
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$pid/status" 2>/dev/null) || return 1
  [ "$state" != Z ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$conf"
}

# Prints pid's start time (proc(5) /proc/PID/stat field 22, clock ticks after boot) while it is
# a live process, not a zombie; fails once it is a zombie or gone.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # shellcheck disable=SC2086 # the fields after "(comm) " split on spaces: state is the first
  set -- ${stat##*) }
  [ "$1" != Z ] || return 1
  echo "${20}"
}

# Waits up to SECONDS for pid, which started at START, to exit (a zombie or gone); false if it
# still runs. By its start time, never its cmdline: an exiting process has released its memory,
# so its cmdline reads empty well before it becomes a zombie (seen under load: stop returned
# while the OSD still ran).
wait_exit() {
  local pid=$1 tenths=$(($2 * 10)) start=$3
  while ours "$pid" "$start"; do
    [ "$tenths" -gt 0 ] || return 1
    sleep 0.1
    tenths=$((tenths - 1))
  done
}

# Stops what DIR/pids records, last started first (rgw, osd, mon): SIGTERM, and SIGKILL after
# STOP_TIMEOUT_S. Keeps DIR/pids while any of them still runs, so stop can be run again.
stop_all() {
  [ -f "$pids" ] || return 0
  local name pid start failed=0
  while read -r name pid start; do
    ours "$pid" "$start" || continue
    [ -n "$start" ] || start=$(start_time "$pid") || continue
    kill -TERM "$pid" 2>/dev/null || true
    wait_exit "$pid" "$STOP_TIMEOUT_S" "$start" && continue
    say "$name (pid $pid) still running ${STOP_TIMEOUT_S}s after SIGTERM: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_exit "$pid" 5 "$start" || { say "$name (pid $pid) did not exit"; failed=1; }
  done < <(tac "$pids")
  [ "$failed" -eq 0 ] || return 1
  rm -f "$pids"
}

# Runs a daemon in the foreground of its own session, output to DIR/log/NAME.out; records its
# pid and start time (setsid execs it: the same process).
launch() {
  local name=$1
  shift
  setsid "$@" -c "$conf" -f </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo "$name $! $(start_time "$!")" >>"$pids"
}

# A free TCP port on 127.0.0.1 (the kernel's pick; a race with another binder is unlikely).
free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

# True while every daemon started so far runs; else says which one exited.
alive() {
  local name pid start
  while read -r name pid start; do
    ours "$pid" "$start" || { say "$name (pid $pid) exited; see $dir/log/$name.out and $dir/log/*.log"; return 1; }
  done <"$pids"
}

ceph_cli() { timeout 60 ceph -c "$conf" --connect-timeout 30 "$@"; }

start() {
  local missing=() b
  for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "not installed: ${missing[*]}; install with: $APT_CMD"
    exit 2
  fi
  command -v node >/dev/null 2>&1 || { say "node is needed (free ports, bucket setup)"; exit 2; }
  if [ -f "$pids" ]; then
    while read -r _ pid start; do
      if ours "$pid" "$start"; then say "already running in $dir (pid $pid); stop it first"; exit 1; fi
    done <"$pids"
    rm -f "$pids"
  fi
  mkdir -p "$dir"
  rm -rf "$dir/mon" "$dir/osd" "$dir/run" "$dir/log" "$dir/rgw" "$dir/env" "$dir/monmap"
  mkdir -p "$dir/mon" "$dir/osd/ceph-0" "$dir/run" "$dir/log" "$dir/rgw"

  # Whatever fails from here on, leave nothing running.
  started=0
  trap 'status=$?; if [ "$started" -eq 0 ]; then say "start failed (exit $status); logs: $dir/log"; tail -n 5 "$dir"/log/*.log >&2 2>/dev/null || true; stop_all || true; fi' EXIT
  trap 'exit 1' INT TERM HUP

  local fsid mon_port rgw_port osd_uuid osd_id t0=$SECONDS
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mon_port=$(free_port)
  rgw_port=$(free_port)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
# Without this, radosgw hangs at "get_initial_auth_request returned -13" under auth none.
ms mon client mode = crc
keyring = /dev/null
mon allow pool size one = true
# Each monitor change waits out this batching interval (1 s by default): rgw start-up makes ~20.
paxos propose interval = 0.05
mon warn on pool no redundancy = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
log to stderr = false
err to stderr = false
mon data = $dir/mon/\$cluster-\$id
osd data = $dir/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = 4294967296

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
EOF

  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/mkfs.out" 2>&1
  launch mon ceph-mon -i a

  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  osd_id=$(ceph_cli osd new "$osd_uuid")
  [ "$osd_id" = 0 ] || { say "ceph osd new gave id '$osd_id', expected 0"; exit 1; }
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$dir/log/mkfs.out" 2>&1
  launch osd ceph-osd -i 0
  # rgw started before the OSD is up waits ~5 s (an objecter tick) on its first pool's PGs.
  until ceph_cli osd stat -f json | grep -q '"num_up_osds":1'; do
    [ $SECONDS -lt $((t0 + START_TIMEOUT_S)) ] || { say "osd.0 not up after ${START_TIMEOUT_S}s"; exit 1; }
    alive || exit 1
    sleep 0.1
  done
  launch rgw radosgw -n client.rgw.a

  local endpoint=http://127.0.0.1:$rgw_port
  # radosgw-admin talks to the cluster directly; rgw creates its zone and pools as it starts.
  local deadline=$((t0 + START_TIMEOUT_S))
  until listening "$rgw_port"; do
    [ $SECONDS -lt $deadline ] || { say "no answer from $endpoint after ${START_TIMEOUT_S}s"; exit 1; }
    alive || exit 1
    sleep 0.2
  done
  timeout 60 radosgw-admin -c "$conf" user create --uid=sbx --display-name=sbx \
    --access-key="$ACCESS_KEY" --secret="$SECRET_KEY" >>"$dir/log/admin.out" 2>&1
  cat >"$dir/env" <<EOF
AWS_ENDPOINT_URL=$endpoint
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=us-east-1
SBX_S3_BUCKET=$BUCKET
EOF
  timeout 60 node "$HERE/create-bucket.mjs" "$dir/env"
  started=1
  trap - EXIT INT TERM HUP
  cat "$dir/env"
  say "up in $((SECONDS - t0))s at $endpoint (bucket $BUCKET, versioning on); stop: $0 stop $dir"
}

# True once something listens on 127.0.0.1:PORT (beast listens once rgw has its pools).
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "$cmd" in
  start) start ;;
  stop)
    stop_all || exit 1
    ;;
  *) usage ;;
esac
