"""SQL migrations applied by `cdc-relay init` (read with importlib.resources)."""
