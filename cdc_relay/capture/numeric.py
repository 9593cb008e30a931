"""``numeric`` and ``money`` columns as Debezium writes them under ``decimal.handling.mode``.

Owns the three forms: ``precise`` (Kafka Connect's ``Decimal`` - the unscaled two's
complement in base64 - for ``numeric(p,s)`` and ``money`` (scale ``money.fraction.digits``,
no precision), ``io.debezium.data.VariableScaleDecimal`` for a ``numeric`` without
precision, NaN and the infinities null), ``string`` (the plain digits at the column's
scale; NaN and the infinities as Debezium's ``NAN``, ``POSITIVE_INFINITY``,
``NEGATIVE_INFINITY``) and ``double`` (a double; NaN and the infinities as JsonConverter
writes them). ``money`` text is read as the walsender prints it: a currency symbol,
``,`` grouping, ``.`` before the fraction and a leading ``-`` (``lc_monetary`` C or an
English locale; docs/table-cdc.md, types).

Pure; must not do I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

__all__ = ["money_mapping_parts", "numeric_mapping_parts"]

Parts = tuple[dict[str, Any], Callable[[str], Any], Any]  # schema, convert, fallback
_WIDE = Context(prec=140_000)  # numeric: up to 131072 digits before the point, 16383 after
_SPECIAL = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}
_VARIABLE_SCHEMA = {
    "type": "struct", "fields": [
        {"type": "int32", "optional": False, "field": "scale"},
        {"type": "bytes", "optional": False, "field": "value"}],
    "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
    "doc": "Variable scaled decimal"}


def _number(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a numeric: {text!r}") from exc


def unscaled_b64(value: int) -> str:
    """A BigInteger's two's-complement bytes (``toByteArray``), base64."""
    length = (value + (value < 0)).bit_length() // 8 + 1
    return base64.b64encode(value.to_bytes(length, "big", signed=True)).decode()


def unscaled_at(number: Decimal, scale: int) -> int:
    """The unscaled integer of ``number`` at ``scale``, exactly (no context rounding)."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    value = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    power: int = 10 ** abs(shift)
    value = value * power if shift >= 0 else value // power
    return -value if sign else value


def _at_scale(number: Decimal, scale: int) -> Decimal:
    return number.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=_WIDE)


def _precise(scale: int) -> Callable[[str], str | None]:
    def convert(text: str) -> str | None:
        number = _number(text)
        if not number.is_finite():
            return None  # Debezium's precise mode writes NaN and the infinities as null
        return unscaled_b64(unscaled_at(number, scale))
    return convert


def _variable(text: str) -> dict[str, Any] | None:
    number = _number(text)
    if not number.is_finite():
        return None
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0")) if number else len(digits)
    scale = max(0, -(exponent + trailing)) if number else 0
    return {"scale": scale, "value": unscaled_b64(unscaled_at(number, scale))}


def _string(scale: int | None) -> Callable[[str], str]:
    def convert(text: str) -> str:
        special = _SPECIAL.get(text)
        if special is not None:
            return special
        number = _number(text)
        return format(number if scale is None else _at_scale(number, scale), "f")
    return convert


def _double(text: str) -> float:
    if text in _SPECIAL:
        return float(text)
    return float(_number(text))


def numeric_mapping_parts(typmod: int, mode: str) -> Parts:
    """``numeric`` of ``typmod`` (below 4: no precision, a variable scale) under ``mode``."""
    variable = typmod < 4
    precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
    if mode == "string":
        return {"type": "string"}, _string(None if variable else scale), \
            "0" if variable else format(Decimal(0).scaleb(-scale), "f")
    if mode == "double":
        return {"type": "double"}, _double, 0.0
    if variable:
        return dict(_VARIABLE_SCHEMA), _variable, {"scale": 0, "value": "AA=="}
    schema = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
              "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}}
    return schema, _precise(scale), "AA=="


def _money_text(text: str) -> str:
    """``-$1,234.56`` / ``($1,234.56)`` → ``-1234.56``."""
    negative = text.startswith(("-", "("))
    digits = "".join(c for c in text if c.isdigit() or c == ".")
    if not digits or digits.count(".") > 1:
        raise ValueError(f"not a money value Debezium reads: {text!r} (lc_monetary must print "
                         "'.' before the fraction)")
    return ("-" if negative else "") + digits


def money_mapping_parts(digits: int, mode: str) -> Parts:
    """``money`` under ``mode``, at scale ``digits`` (``money.fraction.digits``)."""
    if mode == "string":  # the value's own digits, as Debezium's (the fallback at ``digits``)
        return {"type": "string"}, _money_text, format(Decimal(0).scaleb(-digits), "f")
    if mode == "double":
        return {"type": "double"}, lambda text: float(_money_text(text)), 0.0
    schema = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
              "parameters": {"scale": str(digits)}}

    def precise(text: str) -> str:
        return unscaled_b64(unscaled_at(_at_scale(_number(_money_text(text)), digits), digits))
    return schema, precise, "AA=="
