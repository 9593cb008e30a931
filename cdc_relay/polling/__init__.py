"""Polling mode's loop: claim a batch, route, produce, await every report, settle (docs/design.md).

Three modules, each importing only the ones before it:

* ``settlement``: pure. ``settle`` decides whose fault each failure of a batch is;
  ``PollStats`` holds the counters of settled batches that metrics and health read.
* ``threads``: how the threads meet. ``Waker`` wakes idle workers, ``monitor_loop``
  turns NOTIFY into wake-ups and refreshes the gauges, ``run_threads`` runs the workers
  and the monitor and stops them all on the first error.
* ``worker``: ``PollWorker``, one worker thread's loop over its own database connection
  and its own sink (plus a helper thread that premarks a batch while its acks are
  awaited, unless ``--no-pipeline``).

``app`` builds and wires them. Beside the loop: ``sql`` (every statement), ``claims`` (one
batch's transaction on one connection) and ``admin`` (the monitor connection,
``dead-letters``, ``cleanup``) are the only modules here that run SQL; none knows Kafka
types (sink/ does).
"""
