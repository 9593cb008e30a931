"""Sinks: where messages go. ``base`` is the protocol; ``kafka`` (confluent-kafka),
``rabbitmq`` (pika) and ``nats`` (nats-py) adapt brokers to it; ``factory`` picks one."""
