"""Errors shared by every layer of the library.

`ValidationError` is what every edge (gRPC, HTTP, CLI, CRDs, YAML) turns bad input into:
it names the offending field with a path such as ``children[2].fragment.length`` and says
why, so a user can fix their input without reading our code.
"""

from __future__ import annotations

import reprlib


class GazetteError(Exception):
    """Base of the errors this library raises on purpose. `retriable` says whether the
    same request is worth sending again later (a fault that passes: nothing was done,
    or the outcome will be resolved), so callers ask the error, not a list of types."""

    retriable: bool = False


class ValidationError(GazetteError, ValueError):
    """Input that breaks a rule; `field` names where, `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)

    def within(self, parent: str) -> ValidationError:
        """The same error seen from an enclosing field (``parent.field``)."""
        if not parent:
            return self
        if not self.field:
            field = parent
        elif self.field.startswith("["):
            field = parent + self.field
        else:
            field = f"{parent}.{self.field}"
        err = ValidationError(field, self.reason)
        err.__cause__ = self.__cause__
        return err


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 200
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 8


def short_repr(value: object) -> str:
    """`repr` of untrusted input for an error message: bounded in length and depth, and
    safe for any value (plain `repr` fails on deep nesting and on ints of over 4300
    digits, and may be megabytes long)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<{value.bit_length()}-bit integer>"
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still described
        return f"<{type(value).__name__}>"
