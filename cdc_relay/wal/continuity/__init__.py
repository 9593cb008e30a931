"""Slot continuity: the slot's recorded history and how a loss is noticed (``records``), and
``--on-slot-loss recover`` (``recovery``)."""
