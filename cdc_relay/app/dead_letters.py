"""Composition root of WAL mode's dead letters: ``dead-letters list --from-topic`` and
``dead-letters replay``.

Reads the dead-letter topic (sink/kafka/dead_letters.py), chooses and rebuilds the
records (ops/dead_letters.py), routes them again and produces them; every line to show
goes to ``say(line, is_error)``. Must not parse options (cli/ops.py does) or remove
anything from the topic. Polling mode's dead letters are rows: app/poll.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cdc_relay.config import KafkaConfig, RouterConfig, TableRef
from cdc_relay.errors import ConfigError, ExitCode


def list_from_topic(kafka: KafkaConfig, topic: str, limit: int, output_format: str) -> str:
    """``dead-letters list --from-topic``: one line (or object) per event, oldest first."""
    from cdc_relay.ops.dead_letters import records_json, records_table, select
    from cdc_relay.sink.kafka.dead_letters import read_dead_letters

    records = select(read_dead_letters(kafka, topic), None, topic)
    records = records[:limit]
    return records_json(records) if output_format == "json" else records_table(records, topic)


def replay(kafka: KafkaConfig, from_topic: str, ids: Sequence[str] | None, *, to_original: bool,
           topic_pattern: str, table: TableRef, say: Callable[[str, bool], None]) -> int:
    """``dead-letters replay``: produce the chosen dead letters again (all when ``ids`` is None)."""
    from cdc_relay.ops.dead_letters import replay_message, select
    from cdc_relay.routing import Router
    from cdc_relay.sink.base import Cause
    from cdc_relay.sink.kafka.dead_letters import produce_again, read_dead_letters

    replay_all = ids is None
    router = Router(RouterConfig(topic_pattern=topic_pattern, dead_letter_topic=from_topic), table)
    chosen = select(read_dead_letters(kafka, from_topic), ids, from_topic)
    sendable, messages, failed, refused = [], [], 0, False
    for record in chosen:
        try:
            messages.append(replay_message(record, router, to_original=to_original))
        except ConfigError as exc:
            if not replay_all:
                raise  # asked for by id: nothing is sent
            failed += 1
            say(f"cdc-relay: error: {exc}", True)
            continue
        sendable.append(record)
    results = produce_again(kafka, messages) if messages else []
    for record, message, error in zip(sendable, messages, results, strict=True):
        if error is None:
            say(f"replayed {record.id} to {message.topic}", False)
        else:
            failed += 1
            refused = refused or error.cause is Cause.TOPIC_FORBIDDEN
            say(f"cdc-relay: error: {record.id} not replayed to {message.topic}: {error.reason}",
                True)
    say(f"replayed {len(chosen) - failed} of {len(chosen)} dead letter(s) from {from_topic}"
        " (nothing was removed from it)", False)
    # A topic the broker forbids is refused access, as everywhere else (exit 6), not a failure.
    return ExitCode.REFUSED if refused else ExitCode.FAILURE if failed else ExitCode.OK
