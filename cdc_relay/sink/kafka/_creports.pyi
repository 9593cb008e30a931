"""Type stub of the compiled delivery reports (_creports.c; docs/design.md)."""

from collections.abc import Callable

from confluent_kafka import KafkaError

from cdc_relay.model import Message
from cdc_relay.sink.base import BatchHandler, DeliveryHandler

class Reports:
    """A Kafka sink's delivery reports: what cdc_relay.sink.kafka.sink.Reports does, in C."""

    handler: DeliveryHandler
    batch: BatchHandler | None
    delivered: int
    @property
    def failure(self) -> Callable[[int, KafkaError, object], None]: ...
    def __init__(self, handler: DeliveryHandler,
                 failure: Callable[[int, KafkaError, object], None]) -> None: ...
    def callback(self, token: int, /) -> Callable[[KafkaError | None, object], None]:
        """The delivery callback of the message ``token`` names: callback(error, message)."""
    def hand_over(self) -> None:
        """Pass the successes kept since the last hand-over to ``batch(tokens)``, if any."""

class Sender:
    """KafkaSink.produce in C, for an exact Message (anything else goes to ``slow``)."""

    produce: Callable[..., None]
    def __init__(self, produce: Callable[..., None], reports: Reports,
                 message_class: type[Message], slow: Callable[[Message, int], None],
                 rejected: Callable[[BaseException], None]) -> None:
        """``produce``: the producer's; ``rejected(exc)`` raises the sink's error for what
        it raised; ``message_class``: cdc_relay.model.Message (TypeError for another)."""
    def send(self, message: Message, token: int, /) -> None:
        """Queue ``message`` with the callback of ``token``, as KafkaSink.produce does."""
