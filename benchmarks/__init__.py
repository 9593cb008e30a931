"""cdc-relay's benchmark harness: WAL mode vs polling vs the machine's limits (benchmarks/README.md).

``python -m benchmarks run [--quick] [--modes …] [--events N] [--broker kafka|tansu] --out
DIR`` starts its own throwaway PostgreSQL cluster and a fresh Kafka broker per measurement
(cdc_relay.local.postgres; ``brokers``: Apache Kafka 4.1 by default, or Tansu), runs the
real ``cdc-relay run`` /
``cdc-relay poll`` as subprocesses, and writes ``results.json``, ``report.md`` and PNG
plots to DIR. See benchmarks/README.md for what
is measured and how to read it.

Modules: ``plan`` (modes and workload sizes), ``procstat`` (CPU and memory from /proc),
``workload`` (backlog preload, the fixed-rate writer), ``kafka_side`` (consumers and the
bare producer, run in child processes), ``limits`` (pg_recvlogical, bare producer,
broker latency floor), ``runner`` (one mode: backlog throughput and latency),
``report`` (JSON, markdown, plots), ``headline`` (the README's first figures),
``brokers`` (the ``--broker`` choice), ``progress`` (the live display), ``machine``.

Benchmarks are not tests: nothing here asserts a figure. The smoke test
(tests/integration/test_benchmark_smoke.py) only checks that a tiny run produces
well-formed output.
"""
