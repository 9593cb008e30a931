#!/usr/bin/env bash
# `make py-matrix` (docs/design.md, "The compiled paths"): the compiled extensions built
# and their unit tests run on other CPython versions (default 3.12 and 3.13, from pyenv),
# each in a throwaway venv under build/py-matrix with only what those tests import.
# Slow (a venv and its wheels per version): CI does not run it; run it when the C code or
# the supported versions change, and record the result in
# docs/decisions/2026-12-03-compiled-extensions.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSIONS=${VERSIONS:-"3.12 3.13"}
ROOT=$PWD
status=0
for version in $VERSIONS; do
  python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/python3 2>/dev/null | tail -1)
  if [ -z "$python" ]; then echo "py-matrix: no CPython $version (pyenv install $version)"; status=1; continue; fi
  out=$ROOT/build/py-matrix/$version
  [ -x "$out/venv/bin/python" ] || "$python" -m venv "$out/venv"
  "$out/venv/bin/python" -m pip install --quiet --disable-pip-version-check pytest pytest-timeout \
    hypothesis orjson click "psycopg[binary]" confluent-kafka prometheus-client
  "$out/venv/bin/python" scripts/build_extensions.py --out "$out/src" >/dev/null
  rm -rf "$out/src/tests" && cp -r tests "$out/src/tests" && cp pyproject.toml "$out/src/"
  echo "py-matrix: $("$out/venv/bin/python" -V)"
  if (cd "$out/src" && PYTHONPATH=$out/src "$out/venv/bin/python" -m pytest -q -p no:cacheprovider \
      --hypothesis-profile=sanitize tests/unit/test_compiled_safety.py \
      tests/unit/test_decoding_entry.py tests/unit/test_stream_reader.py \
      tests/unit/test_kafka_reports.py tests/unit/test_kafka_sender.py tests/unit/test_routing.py \
      tests/unit/test_routing_compiled.py tests/unit/test_decoding_wal2json.py \
      tests/unit/test_decoding_pgoutput.py tests/unit/test_decoding_timestamps.py \
      tests/unit/test_path_choice.py 2>&1 | tail -3); then :; else status=1; fi
done
exit $status
