"""Type stub of the compiled delivery reports (_creports.c; docs/design.md)."""

from collections.abc import Callable

from confluent_kafka import KafkaError

from cdc_relay.sink.base import BatchHandler, DeliveryHandler

class Reports:
    """A Kafka sink's delivery reports: what cdc_relay.sink.kafka.Reports does, in C."""

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
