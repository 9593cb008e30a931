"""The Redis Streams sink (redis-py): the sink (``sink``), its settings (``config``), one
entry's shape (``entries``) and doctor's probe (``probe``)."""
