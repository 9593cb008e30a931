"""The Amazon Kinesis Data Streams sink (boto3): the sink (``sink``), its settings (``config``),
one record's shape (``records``), the client (``client``) and doctor's probe (``probe``)."""
