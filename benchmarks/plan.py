"""What a benchmark run does: the relay modes compared and the workload sizes.

A ``Mode`` is how ``cdc-relay`` is initialised and started for one column of the
report; a ``Plan`` is one run's workload (backlog size, insert rates, durations) and the
Kafka broker it runs against (benchmarks/brokers.py).
Pure values: nothing here starts a process.

Modes use the relay's shipped defaults except for what names the mode:

=============  ==========================================  ============================
mode           cdc-relay init                              cdc-relay …
=============  ==========================================  ============================
wal-wal2json   ``--plugin wal2json --no-trigger``          ``run --plugin wal2json``
wal-pgoutput   ``--plugin pgoutput --no-trigger``          ``run --plugin pgoutput``
poll-1s        ``--no-slot --no-trigger``                  ``poll --interval 1s --no-notify``
poll-100ms     ``--no-slot --no-trigger``                  ``poll --interval 100ms --no-notify``
poll-notify    ``--no-slot`` (the NOTIFY trigger is on)    ``poll --interval 1s``
poll-batch500  ``--no-slot --no-trigger``                  ``poll --batch-size 500 --interval 100ms
                                                           --no-notify`` (docs/polling.md's
                                                           settings for throughput)
poll-classic   ``--no-slot --no-trigger``                  ``python -m benchmarks.classic``: the
                                                           textbook relay, the baseline
wal-rabbitmq   ``--plugin wal2json --no-trigger``          ``run --plugin wal2json --sink rabbitmq``
wal-nats       ``--plugin wal2json --no-trigger``          ``run --plugin wal2json --sink nats``
wal-sqs        ``--plugin wal2json --no-trigger``          ``run --plugin wal2json --sink sqs``
                                                           (moto's server; only when named)
wal-redis,     ``--plugin wal2json --no-trigger``          ``run --plugin wal2json --sink redis``
wal-http,                                                  (``http``, ``kinesis``): a redis-server,
wal-kinesis                                                an HTTP receiver, moto's server of the
                                                           run's own; only when named
wal-*-eos      as the plugin's WAL mode                    ``run --exactly-once --txn-interval
                                                           100ms`` (``-eos-20ms``, ``-eos-500ms``:
                                                           other intervals; not in the default set)
wal-pgoutput-  as wal-pgoutput                            ``run --plugin pgoutput --message-format
avro                                                       avro`` through a fresh Apicurio Registry
                                                           (workload.ORDER_PLACED_AVRO; only when
                                                           named, throughput only)
debezium-      ``--plugin pgoutput --no-trigger``          ``python -m benchmarks.debezium``:
embedded                                                   Debezium embedded with the outbox
                                                           router, the reference (``-poll10``:
                                                           ``poll.interval.ms=10``)
capture-       ``--plugin pgoutput --no-trigger --capture  ``run --plugin pgoutput --capture
pgoutput       public.bench_items``                        public.bench_items --capture-prefix
                                                           bench --message-format debezium-json``
debezium-      same                                        ``python -m benchmarks.debezium
capture                                                    --capture …``: Debezium's connector,
                                                           no router, JsonConverter with schemas
=============  ==========================================  ============================

The two table-CDC modes (``TABLE_CDC_MODES``: ``workload="table"``, benchmarks/table_cdc.py)
stream a captured table's mixed backlog instead of outbox rows; they run only when named
or with ``run --table-cdc``.

The debezium-embedded modes need the ``bench-debezium`` extra and Java 17+; a run skips
them with one line where either is missing (benchmarks/debezium.py).

wal-rabbitmq and wal-nats publish to the machine's RabbitMQ and NATS JetStream instead
of a throwaway Kafka broker, and measure backlog throughput only; wal-sqs does the same
with a throwaway moto server, which bounds it (moto is no measure of SQS), so it runs only
when named.

WAL modes and plain polling run without the NOTIFY trigger (they do not need it, and
it costs inserts: docs/design.md, polling mode); only poll-notify pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Mode:
    """One way of running the relay."""

    name: str
    kind: str  # "wal" or "poll"
    plugin: str | None
    init_args: tuple[str, ...]
    relay_args: tuple[str, ...]
    module: str = "cdc_relay"  # what ``python -m`` runs: the relay, or a baseline
    sink: str = "kafka"  # kafka | rabbitmq | nats | sqs | redis | http | kinesis (other_sinks.py)
    workload: str = "outbox"  # outbox rows, or "table": a captured table's changes (table_cdc.py)
    registry: bool = False  # a fresh Apicurio Registry; the payload encoded with ORDER_PLACED_AVRO

    @property
    def is_relay(self) -> bool:
        """True for cdc-relay itself, False for the classic baseline and Debezium."""
        return self.module == "cdc_relay"

    @property
    def is_debezium(self) -> bool:
        """Debezium embedded (benchmarks/debezium.py): a reference, skipped where it cannot run."""
        return self.module == "benchmarks.debezium"


CAPTURED = "public.bench_items"  # benchmarks.table_cdc.TABLE (a pure module: not imported)
CAPTURE_PREFIX = "bench"  # benchmarks.table_cdc.PREFIX
_CAPTURE_INIT = ("--plugin", "pgoutput", "--no-trigger", "--capture", CAPTURED)

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("wal-wal2json", "wal", "wal2json", ("--plugin", "wal2json", "--no-trigger"),
         ("run", "--plugin", "wal2json")),
    Mode("wal-pgoutput", "wal", "pgoutput", ("--plugin", "pgoutput", "--no-trigger"),
         ("run", "--plugin", "pgoutput")),
    Mode("poll-1s", "poll", None, ("--no-slot", "--no-trigger"),
         ("poll", "--interval", "1s", "--no-notify")),
    Mode("poll-100ms", "poll", None, ("--no-slot", "--no-trigger"),
         ("poll", "--interval", "100ms", "--no-notify")),
    Mode("poll-notify", "poll", None, ("--no-slot",), ("poll", "--interval", "1s")),
    Mode("poll-batch500", "poll", None, ("--no-slot", "--no-trigger"),
         ("poll", "--batch-size", "500", "--interval", "100ms", "--no-notify")),
    Mode("poll-classic", "poll", None, ("--no-slot", "--no-trigger"), (), module="benchmarks.classic"),
    Mode("wal-rabbitmq", "wal", "wal2json", ("--plugin", "wal2json", "--no-trigger"),
         ("run", "--plugin", "wal2json"), sink="rabbitmq"),
    Mode("wal-nats", "wal", "wal2json", ("--plugin", "wal2json", "--no-trigger"),
         ("run", "--plugin", "wal2json"), sink="nats"),
    Mode("wal-sqs", "wal", "wal2json", ("--plugin", "wal2json", "--no-trigger"),
         ("run", "--plugin", "wal2json"), sink="sqs"),
    *(Mode(f"wal-{sink}", "wal", "wal2json", ("--plugin", "wal2json", "--no-trigger"),
           ("run", "--plugin", "wal2json"), sink=sink) for sink in ("redis", "http", "kinesis")),
    *(Mode(f"wal-{plugin}-eos{suffix}", "wal", plugin, ("--plugin", plugin, "--no-trigger"),
           ("run", "--plugin", plugin, "--exactly-once", "--checkpoint-topic", "bench.checkpoints",
            "--txn-interval", interval))
      for plugin in ("wal2json", "pgoutput")
      for suffix, interval in (("", "100ms"), ("-20ms", "20ms"), ("-500ms", "500ms"))),
    Mode("wal-pgoutput-avro", "wal", "pgoutput", ("--plugin", "pgoutput", "--no-trigger"),
         ("run", "--plugin", "pgoutput", "--message-format", "avro"), registry=True),
    Mode("debezium-embedded", "wal", "pgoutput", ("--plugin", "pgoutput", "--no-trigger"), (),
         module="benchmarks.debezium"),
    Mode("debezium-embedded-poll10", "wal", "pgoutput", ("--plugin", "pgoutput", "--no-trigger"),
         ("--poll-interval-ms", "10"), module="benchmarks.debezium"),
    Mode("capture-pgoutput", "wal", "pgoutput", _CAPTURE_INIT,
         ("run", "--plugin", "pgoutput", "--capture", CAPTURED, "--capture-prefix", CAPTURE_PREFIX,
          "--message-format", "debezium-json"), workload="table"),
    Mode("debezium-capture", "wal", "pgoutput", _CAPTURE_INIT,
         ("--capture", CAPTURED, "--capture-prefix", CAPTURE_PREFIX), module="benchmarks.debezium",
         workload="table"),
)}
TABLE_CDC_MODES = ("capture-pgoutput", "debezium-capture")
# A full or quick run measures these; the other exactly-once intervals, wal-sqs and the
# modes of the sinks added with it only when named.
NAMED_ONLY = ("wal-sqs", "wal-redis", "wal-http", "wal-kinesis", "wal-pgoutput-avro",
              *TABLE_CDC_MODES)
DEFAULT_MODES = tuple(name for name in MODES
                      if not name.endswith(("-20ms", "-500ms")) and name not in NAMED_ONLY)

FULL_EVENTS = (100_000, 200_000)  # backlog sizes: both are reported
QUICK_EVENTS = (50_000,)
FULL_ROUNDS = 3  # every figure of a full run is the median of this many, with min-max
QUICK_ROUNDS = 1
FULL_RATES = (100, 1_000, 5_000)
QUICK_RATES = (100, 1_000, 5_000)
FULL_DURATION = 10.0
QUICK_DURATION = 5.0
EVENTS_PER_BACKLOG_TXN = 100
# The fixed-rate writer commits at most this many transactions per second; above it,
# each transaction carries ceil(rate / MAX_TXN_RATE) events (one client cannot commit
# 5,000 single-row transactions a second here: about 4.8k were measured).
MAX_TXN_RATE = 1_000


def parse_modes(text: str) -> tuple[Mode, ...]:
    """``wal-wal2json,poll-notify`` → Modes; ValueError naming the known ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODES]
    if unknown or not names:
        raise ValueError(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(MODES)}")
    return tuple(MODES[n] for n in dict.fromkeys(names))


@dataclass(frozen=True)
class Plan:
    """One benchmark run's workload."""

    out: Path
    modes: tuple[Mode, ...] = tuple(MODES.values())
    sizes: tuple[int, ...] = FULL_EVENTS  # backlog sizes measured, each in every round
    rounds: int = FULL_ROUNDS
    rates: tuple[int, ...] = FULL_RATES
    duration: float = FULL_DURATION  # measured seconds per latency rate
    warmup: float = 1.0  # written but not measured, before each latency rate
    floor_rate: int = 1_000
    label: str = "full"
    relay_extra: tuple[str, ...] = field(default=())  # extra args for every relay process
    broker: str = "kafka"  # benchmarks/brokers.py: kafka (Apache Kafka 4.1) or tansu
    broker_warmup: int = 1  # messages through each fresh broker before a mode (kafka_side.warm_up)

    @property
    def events(self) -> int:
        """The largest backlog size (what the limits and the pre-sizing use)."""
        return max(self.sizes)

    def events_per_txn(self, rate: int) -> int:
        """Events per transaction the fixed-rate writer uses at ``rate`` events/s."""
        return max(1, -(-rate // MAX_TXN_RATE))
