"""``emit_encoded`` of every integration shares one step (cdc_relay/outbox_encoded.py,
``encoded_steps``): the payload is encoded for the topic before any statement, and the
statement carries the serializer's bytes in the adapter's parameter style. Fakes only."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from cdc_relay.integrations import asyncpg as pg_async
from cdc_relay.integrations import sqlalchemy as sa_outbox
from cdc_relay.outbox_encoded import encoded_steps

FRAME = b"\x00" + (42).to_bytes(4, "big") + b"\x02\x0e"


class Recorder:
    """A serializer: records the topics it was asked for and returns ``FRAME``."""

    def __init__(self, result: bytes = FRAME) -> None:
        self.topics: list[str] = []
        self.result = result

    def __call__(self, value: Any, ctx: Any) -> bytes:
        self.topics.append(f"{ctx.topic}:{ctx.field}")
        return self.result


class FakeAsyncpg:
    """An asyncpg connection that records its statements."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def execute(self, text: str, *params: Any) -> str:
        self.statements.append((text, params))
        return "INSERT 0 1"


class FakeSession:
    """A SQLAlchemy session's ``execute`` that records the statements."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, dict[str, Any]]] = []

    def execute(self, clause: Any, params: dict[str, Any]) -> None:
        self.statements.append((str(clause), params))


@pytest.mark.parametrize(("style", "marker"), [("format", "%s"), ("numeric", "$5"), ("named", ":p5")])
def test_the_shared_step_encodes_for_the_default_topic_then_inserts_the_bytes(
        style: str, marker: str) -> None:
    serializer = Recorder()
    steps = encoded_steps("order", "o-1", "OrderCreated", {"id": 1}, serializer=serializer,
                          topic=None, style=style, where=lambda: "db", traceparent=None)
    assert serializer.topics == ["outbox.event.order:value"]  # before the first statement
    query = next(steps)
    assert marker in query.text
    values = list(query.params.values()) if isinstance(query.params, dict) else list(query.params)
    assert values[1:] == ["order", "o-1", "OrderCreated", FRAME]


def test_asyncpg_emit_encoded_refuses_what_is_not_the_wire_format_before_any_statement() -> None:
    conn = FakeAsyncpg()
    with pytest.raises(ValueError, match="Confluent wire format"):
        asyncio.run(pg_async.emit_encoded(conn, "order", "o-1", "E", {}, traceparent=None,
                                          serializer=Recorder(b'{"id": 1}')))
    assert conn.statements == []
    given = uuid.uuid4()
    assert asyncio.run(pg_async.emit_encoded(conn, "order", "o-1", "E", {}, id=given,
                                             traceparent=None, serializer=Recorder(),
                                             topic="t")) == given
    assert conn.statements[0][1][1:] == ("order", "o-1", "E", FRAME)


def test_sqlalchemy_emit_encoded_uses_its_named_parameters_and_the_given_topic() -> None:
    session = FakeSession()
    serializer = Recorder()
    sa_outbox.emit_encoded(session, "order", "o-1", "E", {}, serializer=serializer,  # type: ignore[arg-type]
                           topic="shop.orders", traceparent=None)
    assert serializer.topics == ["shop.orders:value"]
    text, params = session.statements[0]
    assert ":p5" in text and params["p5"] == FRAME
    with pytest.raises(ValueError, match="Confluent wire format"):
        sa_outbox.emit_encoded(session, "order", "o-2", "E", {},  # type: ignore[arg-type]
                               serializer=Recorder(b"nope"), traceparent=None)
    assert len(session.statements) == 1
