"""Rules for the names of things: journals, shards, labels, etcd keys.

Names travel through URLs, etcd keys, file paths and label selectors, so they keep to a
small alphabet. Every check raises `ValidationError` naming the field and the reason.
"""

from __future__ import annotations

import functools
import importlib
import re
import string
from typing import Any

from gazette.errors import ValidationError, short_repr

_ALNUM = frozenset(string.ascii_letters + string.digits)

#: Symbols allowed in journal names and shard ids besides ASCII letters and digits. A
#: subset of label value symbols, so the implicit ``name`` and ``prefix`` labels of every
#: journal can be written in a selector.
PATH_SYMBOLS = "-_+/.%"
#: Symbols allowed in label names besides ASCII letters and digits.
LABEL_NAME_SYMBOLS = "-_./"
#: Symbols allowed in label values besides ASCII letters and digits. Selector syntax
#: characters (``,()!=`` and whitespace) are deliberately absent.
LABEL_VALUE_SYMBOLS = "-_+/.%:@"

MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN = 2, 512
MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN = 1, 512
MIN_LABEL_NAME_LEN, MAX_LABEL_NAME_LEN = 1, 64
MAX_LABEL_VALUE_LEN = 1024


def _describe(ch: str) -> str:
    return repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}"


@functools.cache
def _token_pattern(symbols: str) -> re.Pattern[str]:
    return re.compile(f"[A-Za-z0-9{re.escape(symbols)}]*")


def validate_token(value: object, field: str, symbols: str, min_len: int, max_len: int) -> str:
    """Check that `value` is a string of letters, digits and `symbols` of bounded length."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if len(value) < min_len:
        what = "must not be empty" if min_len == 1 else f"is shorter than {min_len} characters"
        raise ValidationError(field, f"{value!r} {what}" if value else what)
    if len(value) > max_len:
        raise ValidationError(field, f"is longer than {max_len} characters ({len(value)})")
    if _token_pattern(symbols).fullmatch(value):
        return value
    allowed = _ALNUM.union(symbols)
    for i, ch in enumerate(value):
        if ch not in allowed:
            raise ValidationError(
                field,
                f"{value!r} has invalid character {_describe(ch)} at {i} "
                f"(allowed: letters, digits and {symbols!r})",
            )
    return value


def validate_path(value: object, field: str, min_len: int, max_len: int,
                  symbols: str = PATH_SYMBOLS) -> str:
    """A token shaped like a relative path: no leading, trailing or doubled ``/``,
    and no ``.`` or ``..`` components."""
    name = validate_token(value, field, symbols, min_len, max_len)
    if name.startswith("/"):
        raise ValidationError(field, f"{name!r} must not begin with '/'")
    if name.endswith("/"):
        raise ValidationError(field, f"{name!r} must not end with '/'")
    for part in name.split("/"):
        if part == "":
            raise ValidationError(field, f"{name!r} must not contain '//'")
        if part in (".", ".."):
            raise ValidationError(field, f"{name!r} must not contain a {part!r} component")
    return name


def validate_journal_name(value: object, field: str = "name") -> str:
    """A journal name, such as ``example/journal``."""
    return validate_path(value, field, MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN)


def validate_shard_id(value: object, field: str = "id") -> str:
    """A shard id, such as ``word-count/part-000``."""
    return validate_path(value, field, MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN)


def validate_prefix(value: object, field: str = "prefix") -> str:
    """A name prefix that groups journals or shards: a path ending in ``/``
    (``foobar/``), or the empty prefix that groups everything."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if value == "":
        return ""
    if not value.endswith("/"):
        raise ValidationError(field, f"{short_repr(value)} must end with '/'")
    validate_path(value[:-1], field, 1, MAX_JOURNAL_NAME_LEN - 1)
    return value


def validate_label_name(value: object, field: str = "name") -> str:
    """A label name, such as ``app.gazette.dev/message-type``."""
    name = validate_token(
        value, field, LABEL_NAME_SYMBOLS, MIN_LABEL_NAME_LEN, MAX_LABEL_NAME_LEN
    )
    if not (name[0].isalnum() and name[-1].isalnum()):
        raise ValidationError(field, f"{name!r} must begin and end with a letter or digit")
    return name


def validate_label_value(value: object, field: str = "value") -> str:
    """A label value; may be empty (a label that only says it exists)."""
    return validate_token(value, field, LABEL_VALUE_SYMBOLS, 0, MAX_LABEL_VALUE_LEN)


def validate_etcd_prefix(value: object, field: str = "etcd_prefix") -> str:
    """An etcd key prefix such as ``/gazette/cluster``: absolute, no trailing ``/``."""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a string, got {type(value).__name__}")
    if not value.startswith("/"):
        raise ValidationError(field, f"{short_repr(value)} must begin with '/'")
    validate_path(value[1:], field, 1, 512)
    return value


def load_attr(spec: str, field: str) -> Any:
    """The object ``module:attr`` names (``attr`` may be dotted), for options that name
    code (a message class, a topic); `ValidationError` naming `field` if it cannot."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValidationError(field, f"{short_repr(spec)} is not module:attribute")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValidationError(field, f"{short_repr(spec)} cannot be loaded: {err}") from err
    return obj
