"""Shared by the router's tests: whether the compiled router (decoding/_croute.c) is built."""

from __future__ import annotations

import importlib


def compiled_router_built() -> bool:
    """Whether cdc_relay.decoding._croute imports."""
    try:
        importlib.import_module("cdc_relay.decoding._croute")
    except ImportError:
        return False
    return True
