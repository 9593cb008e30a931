"""The error rule (docs/design.md, errors): every user-visible RelayError is defined in errors.py.

An exception a loop raises and catches itself (control flow: replace the producer,
replay a Kafka transaction) may stay beside its loop; those are named here, so a new
RelayError defined anywhere else fails this test until it moves to errors.py or is
added here with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_relay"
# Caught by the loop that raises them; they never end a command.
CONTROL_FLOW = {
    "ProducerFailed",  # the delivery engine: replace the producer, replay
    "TopicUnavailable",  # a ProducerFailed for a missing or forbidden topic
    "KafkaTransactionAborted",  # exactly-once: replay from the checkpoint on a new session
}


def _classes(path: Path) -> list[tuple[str, list[str]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.name, [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases])
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def test_every_relay_error_outside_errors_py_is_control_flow() -> None:
    hierarchy = {"RelayError"}
    for name, bases in _classes(PACKAGE / "errors.py"):
        if hierarchy & set(bases):
            hierarchy.add(name)
    elsewhere = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "errors.py" or path.parent != PACKAGE:
            for name, bases in _classes(path):
                elsewhere[name] = (path.relative_to(PACKAGE.parent), bases)
    changed = True
    while changed:  # subclasses of subclasses, wherever they are defined
        changed = False
        for name, (_, bases) in elsewhere.items():
            if name not in hierarchy and hierarchy & set(bases):
                hierarchy.add(name)
                changed = True
    stray = sorted(f"{path}: {name}" for name, (path, _) in elsewhere.items()
                   if name in hierarchy and name not in CONTROL_FLOW)
    assert stray == []
