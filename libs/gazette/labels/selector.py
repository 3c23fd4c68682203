"""Selector: which journals or shards a query means, by their labels.

A selector is the conjunction of included and excluded labels, written as in Kubernetes
(``prefix=foobar/, name notin (foobar/part-001)``). Because Gazette labels are a
multi-map, an included name matches when *any* of the set's values is included, and an
excluded name fails when *any* of them is excluded.

`parse_selector` takes untrusted text (a ``-l`` flag, a request field) and only ever
raises `ValidationError`, quoting the problem and where it is; `Selector.format` gives a
canonical text that parses back to an equal selector.
"""

from __future__ import annotations

import json
import string
from typing import Any, NamedTuple, NoReturn

from gazette.errors import ValidationError
from gazette.labels.labelset import EMPTY, PREFIX, Label, LabelSet
from gazette.names import (
    LABEL_NAME_SYMBOLS,
    LABEL_VALUE_SYMBOLS,
    validate_label_name,
    validate_label_value,
)

#: Characters that the syntax uses; never part of a name or value token.
_SYNTAX = frozenset(",()!=")
#: Characters of name and value tokens.
_WORD = frozenset(string.ascii_letters + string.digits + LABEL_NAME_SYMBOLS + LABEL_VALUE_SYMBOLS)
_WORD -= _SYNTAX
_NAME = frozenset(string.ascii_letters + string.digits + LABEL_NAME_SYMBOLS)
#: Longest text quoted whole in an error; longer text is quoted around the error.
_QUOTE_LIMIT = 80


class Selector:
    """Included and excluded labels; `matches` says whether a label set is selected.

    For each name in `include`, a set must have at least one of the included values, an
    included empty value meaning any value at all. For each name in `exclude`, a set must
    have none of the excluded values, an excluded empty value meaning the label must be
    absent. The empty selector matches everything.
    """

    __slots__ = ("_exc", "_exclude", "_hash", "_inc", "_include")

    _include: LabelSet
    _exclude: LabelSet
    # name → allowed values, or None when any value will do (an included "").
    _inc: tuple[tuple[str, frozenset[str] | None], ...]
    # name → forbidden values, or None when the label must be absent (an excluded "").
    _exc: tuple[tuple[str, frozenset[str] | None], ...]
    _hash: int

    def __init__(self, include: LabelSet = EMPTY, exclude: LabelSet = EMPTY) -> None:
        for arg, value in (("include", include), ("exclude", exclude)):
            if not isinstance(value, LabelSet):
                raise ValidationError(arg, f"expected a LabelSet, got {type(value).__name__}")
        self._include = include
        self._exclude = exclude
        self._inc = _compile(include)
        self._exc = _compile(exclude)
        self._hash = hash((include, exclude))

    @property
    def include(self) -> LabelSet:
        """Labels of which a selected set must have, per name, at least one."""
        return self._include

    @property
    def exclude(self) -> LabelSet:
        """Labels of which a selected set must have none."""
        return self._exclude

    @classmethod
    def parse(cls, text: str, field: str = "selector") -> Selector:
        """Same as `parse_selector`."""
        return parse_selector(text, field)

    def matches(self, labels: LabelSet) -> bool:
        """Whether `labels` (with implicit labels added, see `journal_labels`) is selected."""
        for name, allowed in self._inc:
            have = labels.values(name)
            if not have or (allowed is not None and allowed.isdisjoint(have)):
                return False
        for name, forbidden in self._exc:
            have = labels.values(name)
            if have and (forbidden is None or not forbidden.isdisjoint(have)):
                return False
        return True

    def format(self) -> str:
        """The canonical text: names sorted, each name's include terms then exclude terms,
        values sorted; ``parse_selector(sel.format()) == sel``."""
        terms: list[str] = []
        for name in sorted({*self.include.names(), *self.exclude.names()}):
            _format_terms(terms, name, self.include.values(name), "", "=", "in")
            _format_terms(terms, name, self.exclude.values(name), "!", "!=", "notin")
        return ", ".join(terms)

    __str__ = format

    def __repr__(self) -> str:
        return f"Selector.parse({self.format()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selector):
            return NotImplemented
        return self.include == other.include and self.exclude == other.exclude

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (Selector, (self.include, self.exclude))


def _compile(labels: LabelSet) -> tuple[tuple[str, frozenset[str] | None], ...]:
    out: list[tuple[str, frozenset[str] | None]] = []
    for name in labels.names():
        values = labels.values(name)
        out.append((name, None if "" in values else frozenset(values)))
    return tuple(out)


def _format_terms(
    terms: list[str], name: str, values: tuple[str, ...], bang: str, op: str, list_op: str
) -> None:
    # Values come sorted, so an existence ("") value is first.
    if values and values[0] == "":
        terms.append(bang + name)
        values = values[1:]
    if len(values) == 1:
        terms.append(f"{name}{op}{values[0]}")
    elif values:
        terms.append(f"{name} {list_op} ({', '.join(values)})")


# --- parsing -------------------------------------------------------------------------


class _Token(NamedTuple):
    kind: str  # "word", "=", "!=", "!", ",", "(", ")" or "end"
    text: str
    pos: int


def _describe_char(ch: str) -> str:
    return repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}"


def _describe(tok: _Token) -> str:
    return "end of selector" if tok.kind == "end" else repr(tok.text)


def parse_selector(text: str, field: str = "selector") -> Selector:
    """Parse selector syntax: comma-separated terms, each one of ``a=x`` (or ``a==x``),
    ``a!=x``, ``a in (x, y)``, ``a notin (x, y)`` (or ``a not in (x, y)``), ``a`` (exists)
    or ``!a`` (absent). Empty text is the empty selector, which selects everything.

    Raises only `ValidationError` (naming `field`), whatever `text` is.
    """
    if not isinstance(text, str):
        raise ValidationError(field, f"expected a string, got {type(text).__name__}")
    return _Parser(text, field).parse()


class _Parser:
    """A recursive-descent parser over the token list; errors carry text positions."""

    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.tokens = self._tokenize()
        self.i = 0

    def fail(self, pos: int, problem: str, detail: str = "") -> NoReturn:
        suffix = f": {detail}" if detail else ""
        raise ValidationError(self.field, f"{problem} at {pos} {self._where(pos)}{suffix}")

    def _where(self, pos: int) -> str:
        text = self.text
        if len(text) <= _QUOTE_LIMIT:
            return "in " + json.dumps(text, ensure_ascii=False)
        lo, hi = max(0, pos - _QUOTE_LIMIT // 2), pos + _QUOTE_LIMIT // 2
        excerpt = ("…" if lo else "") + text[lo:hi] + ("…" if hi < len(text) else "")
        return "near " + json.dumps(excerpt, ensure_ascii=False)

    def _tokenize(self) -> list[_Token]:
        text, n = self.text, len(self.text)
        tokens: list[_Token] = []
        pos = 0
        while pos < n:
            ch = text[pos]
            if ch.isspace():
                pos += 1
            elif ch in _WORD:
                end = pos + 1
                while end < n and text[end] in _WORD:
                    end += 1
                tokens.append(_Token("word", text[pos:end], pos))
                pos = end
            elif ch in "=!" and text.startswith("=", pos + 1):
                kind = "=" if ch == "=" else "!="
                tokens.append(_Token(kind, text[pos : pos + 2], pos))
                pos += 2
            elif ch in _SYNTAX:
                tokens.append(_Token(ch, ch, pos))
                pos += 1
            else:
                self.fail(pos, f"unexpected character {_describe_char(ch)}")
        tokens.append(_Token("end", "", n))
        return tokens

    def next(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def parse(self) -> Selector:
        include: list[Label] = []
        exclude: list[Label] = []
        if self.peek().kind == "end":
            return Selector()
        while True:
            self.term(include, exclude)
            tok = self.next()
            if tok.kind == "end":
                return Selector(LabelSet._trusted(include), LabelSet._trusted(exclude))
            if tok.kind != ",":
                self.fail(tok.pos, f"expected ',' or end of selector, found {_describe(tok)}")

    def term(self, include: list[Label], exclude: list[Label]) -> None:
        tok = self.next()
        if tok.kind == "!":
            exclude.append(Label(self.name(self.next()), ""))
            return
        name = self.name(tok)
        op = self.peek()
        if op.kind in (",", "end"):
            include.append(Label(name, ""))
        elif op.kind in ("=", "!="):
            self.next()
            target = include if op.kind == "=" else exclude
            target.append(Label(name, self.single_value(name, op)))
        elif op.kind == "word" and op.text in ("in", "notin", "not"):
            self.next()
            if op.text == "not":
                after = self.next()
                if after.kind != "word" or after.text != "in":
                    self.fail(after.pos, f"expected 'in' after 'not', found {_describe(after)}")
            target = include if op.text == "in" else exclude
            target.extend(Label(name, value) for value in self.value_list(name))
        else:
            self.fail(
                op.pos,
                f"expected '=', '!=', 'in', 'notin' or ',' after label name {name!r}, "
                f"found {_describe(op)}",
            )

    def name(self, tok: _Token) -> str:
        if tok.kind != "word":
            self.fail(tok.pos, f"expected a label name, found {_describe(tok)}")
        for offset, ch in enumerate(tok.text):
            if ch not in _NAME:
                self.fail(tok.pos + offset, f"label name {tok.text!r} has invalid character {ch!r}")
        try:
            return validate_label_name(tok.text, self.field)
        except ValidationError as err:
            self.fail(tok.pos, "invalid label name", err.reason)

    def value(self, tok: _Token, name: str = "") -> str:
        if tok.kind != "word":
            self.fail(tok.pos, f"expected a label value, found {_describe(tok)}")
        try:
            value = validate_label_value(tok.text, self.field)
        except ValidationError as err:
            self.fail(tok.pos, "invalid label value", err.reason)
        if name == PREFIX and not value.endswith("/"):
            # Prefix labels are a name's folders, each ending in '/': this would select
            # nothing, silently.
            self.fail(tok.pos, f"a prefix ends with '/' (the folder of the journals or "
                      f"shards to select); {value!r} selects nothing: for that one name, "
                      f"use name={value} (journals) or id={value} (shards)")
        return value

    def single_value(self, name: str, op: _Token) -> str:
        tok = self.peek()
        if tok.kind in (",", "end"):
            if op.kind == "=":
                hint = f"'{name}' to select on existence"
            else:
                hint = f"'!{name}' to select on absence"
            self.fail(tok.pos, f"empty value after '{op.text}' (use {hint})")
        return self.value(self.next(), name)

    def value_list(self, name: str) -> list[str]:
        tok = self.next()
        if tok.kind != "(":
            self.fail(tok.pos, f"expected '(', found {_describe(tok)}")
        if self.peek().kind == ")":
            self.fail(self.peek().pos, "expected at least one value in '( )'")
        values: list[str] = []
        while True:
            values.append(self.value(self.next(), name))
            tok = self.next()
            if tok.kind == ")":
                return values
            if tok.kind != ",":
                self.fail(tok.pos, f"expected ',' or ')', found {_describe(tok)}")
