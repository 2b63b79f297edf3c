#!/usr/bin/env bash
# A PostgreSQL server of the tests' own on loopback (Debian postgresql), in a folder of its own.
# Usage: scripts/postgres.sh start DIR [PORT]   — initdb (once) and start; prints the URL the tests take
#        scripts/postgres.sh stop DIR
# DIR must be reachable by the server's user (as root: `postgres`), e.g. under /tmp.
# The server listens on 127.0.0.1:PORT (default: a free port; kept in DIR/port for a restart) and a socket in DIR, trusts loopback connections of
# the user `vigil` (a test cluster: no password) and has a database `vigil_test`. As root it runs as the
# `postgres` user the package creates (PostgreSQL refuses to run as root).
set -euo pipefail
cmd=${1:?start|stop}
dir=$(realpath -m "${2:?data folder}")
port=${3:-}
if [[ -z $port && -f $dir/port ]]; then port=$(cat "$dir/port"); fi
if [[ -z $port ]]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[[ -x $bin/initdb ]] || { echo "postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case $cmd in
  start)
    mkdir -p "$dir"
    echo "$port" >"$dir/port"
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$dir"; fi
    if [[ ! -f $dir/data/PG_VERSION ]]; then
      as_owner "$bin/initdb" -D "$dir/data" -U vigil --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if ! as_owner "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=on" start >/dev/null ||
        { tail -20 "$dir/server.log" >&2; exit 1; }
    fi
    "$bin/psql" -h 127.0.0.1 -p "$port" -U vigil -d postgres -qtAc \
      "SELECT 1 FROM pg_database WHERE datname = 'vigil_test'" | grep -q 1 ||
      "$bin/createdb" -h 127.0.0.1 -p "$port" -U vigil vigil_test
    echo "postgresql://vigil@127.0.0.1:$port/vigil_test"
    ;;
  stop)
    [[ -f $dir/data/PG_VERSION ]] && as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  *) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
