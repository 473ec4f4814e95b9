#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests: its own cluster in DIR, reachable only through a Unix
# socket in DIR (no TCP port, so tests running at once never collide), trust authentication.
# As root, the server runs as the `postgres` user (PostgreSQL refuses to run as root).
#   pg-server.sh start DIR   prints the connection URI (database "kiln") on stdout
#   pg-server.sh stop DIR    stops it (fast shutdown); DIR is left for the caller to remove
#   pg-server.sh restart DIR starts a stopped server again, with its data
set -euo pipefail
action="${1:?start|stop}"
dir="$(cd "${2:?DIR}" && pwd)"
bin="$(pg_config --bindir)"
as=()
if [[ "$(id -u)" -eq 0 ]]; then
  chown postgres: "$dir"
  as=(runuser -u postgres --)
fi
case "$action" in
  start)
    "${as[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres > "$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; exit 1; }
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-k $dir -c listen_addresses='' -c fsync=off" start > /dev/null ||
      { cat "$dir/server.log" >&2; exit 1; }
    "${as[@]}" "$bin/createdb" -h "$dir" -U postgres kiln
    echo "postgresql:///kiln?host=$dir&user=postgres"
    ;;
  restart)
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-k $dir -c listen_addresses='' -c fsync=off" start > /dev/null ||
      { cat "$dir/server.log" >&2; exit 1; }
    ;;
  stop)
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop > /dev/null
    ;;
  *)
    echo "pg-server.sh: unknown action $action" >&2
    exit 2
    ;;
esac
