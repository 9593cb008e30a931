"""The Kafka sink: the producer behind the Sink protocol (``sink``), its settings and error
classes (``client``), transactions (``txn``), the checkpoint topic (``checkpoint``), reading
back and producing dead letters again (``dead_letters``), compiled reports (``_creports``)."""
