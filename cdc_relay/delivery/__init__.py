"""The delivery engine: what every loop does between "route this event" and "it is acked".

Mode-neutral: WAL mode's session, the backfill and the polling worker each use it
(docs/design.md, the delivery engine). ``watermark`` is the low-watermark of delivered
tokens (AckTracker's base); ``engine`` produces with backpressure, applies the refusal
and dead-letter policy and keeps the messages in flight; ``producer`` builds and warms
up a replacement producer. It talks only to the Sink protocol (sink/base.py) and the
Router: it must not import a driver, a mode (wal/, polling/), ops/ or cli/.

This ``__init__`` imports nothing, so ``acks`` can use the watermark without loading
the rest.
"""
