#!/usr/bin/env bash
# A throwaway PostgreSQL for trying the shared tenant store on one machine: a cluster of its own
# in DIR (Debian's postgresql, which deploy/install-deps.sh installs), on 127.0.0.1:PORT only,
# trusting local connections, with a database `edgeinfer` owned by the user `edge`. Not for
# production (no password, fsync as configured by default); run as root, the cluster belongs to
# the postgres user, as PostgreSQL refuses to run as root.
#
#   deploy/local-postgres.sh start DIR [PORT]   made on first use, started (unless running); prints the store's URL
#   deploy/local-postgres.sh stop DIR           stops it (the data stays in DIR)
#   deploy/local-postgres.sh remove DIR         stops it and deletes DIR
set -euo pipefail

usage() { echo "usage: $0 start DIR [PORT] | stop DIR | remove DIR" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
action=$1
dir=$2
port=${3:-5432}

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[[ -x "$bin/postgres" ]] || { echo "$0: PostgreSQL is not installed (deploy/install-deps.sh installs it)" >&2; exit 1; }
as_owner=()
if [[ $(id -u) -eq 0 ]]; then as_owner=(setpriv --reuid=postgres --regid=postgres --init-groups); fi

case $action in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ ${#as_owner[@]} -gt 0 ]]; then
      chown postgres:postgres "$dir"
      if ! "${as_owner[@]}" test -w "$dir"; then
        echo "$0: the postgres user cannot reach $dir: every folder above it must be searchable (chmod o+x)," \
          "or use a folder under /tmp" >&2
        exit 1
      fi
    fi
    if [[ ! -f "$dir/data/PG_VERSION" ]]; then
      "${as_owner[@]}" "$bin/initdb" -D "$dir/data" -U edge --auth=trust -E UTF8 --locale=C >"$dir/initdb.log"
    fi
    if ! "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w \
        -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir" start >/dev/null
    fi
    url="postgresql://edge@127.0.0.1:$port/edgeinfer"
    if [[ -z $(psql -X -q -t -A -d "postgresql://edge@127.0.0.1:$port/postgres" \
                 -c "SELECT 1 FROM pg_database WHERE datname = 'edgeinfer'") ]]; then
      psql -X -q -d "postgresql://edge@127.0.0.1:$port/postgres" -c 'CREATE DATABASE edgeinfer'
    fi
    echo "$url"
    ;;
  stop | remove)
    if [[ -f "$dir/data/postmaster.pid" ]]; then
      "${as_owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    if [[ $action == remove ]]; then rm -rf "$dir"; fi
    ;;
  *) usage ;;
esac
