"""The composition roots: one module per command family, the only place that wires concrete parts.

The rule: every command's root lives here, named after the command it serves -
``run`` (WAL mode), ``poll`` (polling mode and its ``dead-letters``/``cleanup``), ``init``
(the outbox's objects and a mode's slot or trigger), ``ops`` (``status``, ``doctor``,
``slot drop``), ``dead_letters`` (WAL mode's ``dead-letters list --from-topic`` and
``dead-letters replay``), ``demo`` (``demo``). cli/ only parses options, builds the frozen
configs, calls one function here and prints; nothing but cli/ imports app/ (the
import-linter contracts of ``make lint``; docs/design.md, layers).
"""
