#!/usr/bin/env bash
# `make sanitize` (docs/design.md, "The compiled paths"): the compiled extensions built with
# AddressSanitizer + UndefinedBehaviorSanitizer into build/sanitize (a copy of the package,
# so the checkout's own builds stay as they are), then, with the ASan runtime preloaded
# into Python: the compiled-path unit tests, and the differential fuzz of every extension
# against its pure twin for FUZZ_SECONDS per target from seed FUZZ_SEED (findings under
# build/sanitize/findings). A memory error or undefined behaviour stops it non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
OUT=$PWD/build/sanitize
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
FUZZ_SEED=${FUZZ_SEED:-1}
CC=${CC:-gcc}
asan=$("$CC" -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "sanitize: $CC has no libasan.so (apt-get install gcc, or libclang-rt-14-dev with CC=clang)" >&2; exit 1; }

CC=$CC "$PY" scripts/build_extensions.py --sanitize --out "$OUT" >/dev/null
# pytest from a copy of the tests beside the package copy: its rootdir goes first on
# sys.path, so every import of cdc_relay (children included, via PYTHONPATH) is the
# sanitized build.
rm -rf "$OUT/tests" && cp -r tests "$OUT/tests" && cp pyproject.toml "$OUT/"
export PYTHONPATH=$OUT
export PYTHONMALLOC=malloc  # every object a malloc of its own: ASan sees past its end
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
PRELOAD=$asan
if ubsan=$("$CC" -print-file-name=libubsan.so) && [ -f "$ubsan" ]; then PRELOAD="$asan:$ubsan"; fi
"$PY" -c "import sys; sys.exit(0)"  # the interpreter itself starts
LD_PRELOAD=$PRELOAD "$PY" -c "from cdc_relay import accel; import sys; \
  sys.exit(0 if accel.all_built() and accel.EXTENSIONS['_cwal2json'] else 1)" \
  || { echo "sanitize: the sanitized extensions do not import" >&2; exit 1; }
cd "$OUT"
LD_PRELOAD=$PRELOAD "$OLDPWD/$PY" -m pytest -q -p no:cacheprovider -x -m "not slow" \
  --hypothesis-profile=sanitize \
  tests/unit/test_compiled_safety.py tests/unit/test_decoding_entry.py \
  tests/unit/test_stream_reader.py tests/unit/test_kafka_reports.py \
  tests/unit/test_kafka_sender.py tests/unit/test_routing.py tests/unit/test_path_choice.py \
  tests/unit/test_decoding_wal2json.py tests/unit/test_decoding_pgoutput.py \
  tests/unit/test_decoding_partitions.py tests/unit/test_decoding_timestamps.py
LD_PRELOAD=$PRELOAD "$OLDPWD/$PY" -m tests.fuzz.fuzz --seconds "$FUZZ_SECONDS" \
  --seed "$FUZZ_SEED" --findings "$OUT/findings"
