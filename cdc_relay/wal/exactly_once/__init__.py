"""Exactly-once delivery (``run --exactly-once``): the delivery mode (``mode``), when a Kafka
transaction closes (``txn_policy``) and the checkpoint it ends with (``checkpoint``)."""
