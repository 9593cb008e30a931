"""Sinks: where messages go. ``base`` is the protocol; ``kafka`` the confluent-kafka adapter."""
