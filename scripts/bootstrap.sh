#!/usr/bin/env bash
# Prepare this checkout for the tests, the demo and the benchmarks (docs/design.md, test services):
#   * .venv with cdc-relay installed editable, extras test,dev,bench (skipped when
#     pyproject.toml has not changed since the last install);
#   * PostgreSQL server binaries and wal2json for its newest installed major version,
#     from Debian's packages (apt-get, as root only; otherwise it says what to install).
# Idempotent and non-interactive: `make test`, `make demo`, `make bench` and CI run it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.cdc-relay-installed"
APT_UPDATED=

say() { echo "bootstrap: $*" >&2; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    say "missing: $*. Install it (as root): apt-get install $*"
    exit 1
  fi
  if [ -z "$APT_UPDATED" ]; then
    say "apt-get update"
    apt-get update -qq
    APT_UPDATED=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" </dev/null
}

newest_pg_version() {
  local dir newest=
  for dir in /usr/lib/postgresql/*/bin; do
    [ -x "$dir/initdb" ] || continue
    local v=${dir#/usr/lib/postgresql/}
    v=${v%/bin}
    if [ -z "$newest" ] || [ "$v" -gt "$newest" ]; then newest=$v; fi
  done
  echo "$newest"
}

# --- Python environment
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  say "pip install -e '.[test,dev,bench]'"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test,dev,bench]'
  touch "$STAMP"
fi

# --- PostgreSQL server and wal2json
pg_version=$(newest_pg_version)
if [ -z "$pg_version" ]; then
  apt_install postgresql
  pg_version=$(newest_pg_version)
  [ -n "$pg_version" ] || { say "PostgreSQL server binaries still not found"; exit 1; }
fi
if [ ! -f "/usr/lib/postgresql/$pg_version/lib/wal2json.so" ]; then
  apt_install "postgresql-$pg_version-wal2json"
fi
