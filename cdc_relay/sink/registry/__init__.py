"""The schema-registry formats (``--message-format avro|json-schema|protobuf``) of the Kafka sink."""
