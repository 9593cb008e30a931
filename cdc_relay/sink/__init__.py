"""Sinks: where messages go. ``base`` is the protocol; ``kafka`` (confluent-kafka),
``rabbitmq`` (pika), ``nats`` (nats-py) and ``sqs`` (boto3) adapt brokers to it; ``factory`` picks one."""
