"""Sinks: where messages go. ``base`` is the protocol; ``kafka/`` (confluent-kafka) and
``sqs/`` (boto3) are rooms of their own, ``rabbitmq`` (pika) and ``nats`` (nats-py) one module
each (their settings in ``config``); ``factory`` picks one."""
