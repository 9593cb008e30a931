"""The SQS sink (boto3): the sink (``sink``), its settings (``config``), batching (``batches``),
one entry's shape (``entries``) and doctor's probe (``probe``)."""
