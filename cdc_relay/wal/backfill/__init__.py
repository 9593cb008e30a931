"""The backfill (``run --snapshot initial``): a slot with an exported snapshot (``snapshot``),
the rows it saw (``rows``), published (``loop``) with durable progress (``state``), then the
hand-over to streaming (``cutover``)."""
