"""Spec trees: many specs written once, with shared fields stated on a common ancestor.

Etcd holds every spec fully spelled out, which is tedious to read and edit by hand. A tree
states what a group of specs share once, on a node named by their common ``/``-ended
prefix, as in ``gazctl journals apply``::

    name: foobar/
    replication: 1
    fragment: {length: 4096}
    children:
    - name: foobar/part-000
    - name: foobar/part-001

`expand` turns a tree into the flat specs it stands for; `fold` turns flat specs into the
smallest such tree, so ``expand(fold(specs)) == normalize(specs)``. Both work on the plain
dict (YAML) form and check only the tree's own structure; the values of spec fields are
validated later, by whoever builds spec objects from the flat dicts.

Merge rules, nearer wins: nested mappings (``fragment``) merge key by key, labels (a list
of ``{name, value}``) merge as a set union, anything else (scalars, lists such as
``stores``) is replaced whole. ``None`` (YAML ``key:`` with nothing) means "not set", as
does an empty mapping, so both are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gazette.errors import ValidationError
from gazette.spectree.kinds import TreeKind

#: Deepest tree (and deepest nesting of a field value) accepted. Real trees are a few
#: levels deep; the bound keeps recursion safe on hostile input.
MAX_DEPTH = 64
#: Most mapping entries and list items one call will look at, so that an alias bomb in
#: YAML (shared references expanding exponentially) fails fast instead of eating memory.
MAX_ITEMS = 1_000_000

Labels = frozenset[tuple[str, str]]


def _join(path: str, key: str) -> str:
    """``path.key``, or ``path[i]`` when `key` is an index."""
    if not path:
        return key
    return path + key if key.startswith("[") else f"{path}.{key}"


def _quote(text: str) -> str:
    """Quote a name in a message so that empty or odd names are visible."""
    return json.dumps(text, ensure_ascii=False)


def _kind_of(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _same(a: Any, b: Any) -> bool:
    """Equality that also insists on equal types, so ``True`` and ``1`` (or ``1.0``) are
    never taken for one another when hoisting: the round trip must be exact."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # an exotic __eq__ (arrays); unequal is the safe answer
        return False


class _Budget:
    """Counts items looked at, to bound the work on any input."""

    def __init__(self) -> None:
        self.left = MAX_ITEMS

    def spend(self, path: str, count: int = 1) -> None:
        self.left -= count
        if self.left < 0:
            raise ValidationError(path, f"input is too large (more than {MAX_ITEMS} items)")


def _check_key(key: object, path: str) -> str:
    if not isinstance(key, str):
        raise ValidationError(path, f"keys must be strings, got {_kind_of(key)}")
    return key


def _check_depth(depth: int, path: str) -> None:
    if depth > MAX_DEPTH:
        raise ValidationError(path, f"nested deeper than {MAX_DEPTH} levels")


def _plain(value: object, path: str, depth: int, budget: _Budget) -> Any:
    """A private copy of a value merged as a whole: mappings become dicts (string keys
    checked), lists and tuples become lists, anything else is kept as it is."""
    _check_depth(depth, path)
    budget.spend(path)
    if isinstance(value, Mapping):
        return {
            _check_key(k, path): _plain(v, _join(path, k), depth + 1, budget)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]", depth + 1, budget) for i, v in enumerate(value)]
    return value


def _fields(value: Mapping[Any, Any], path: str, depth: int, budget: _Budget) -> dict[str, Any]:
    """A nested mapping that merges key by key, with its unset (None, empty) keys dropped."""
    _check_depth(depth, path)
    out: dict[str, Any] = {}
    for key, item in value.items():
        _check_key(key, path)
        budget.spend(path)
        if item is None:
            continue
        sub = _join(path, key)
        if isinstance(item, Mapping):
            nested = _fields(item, sub, depth + 1, budget)
            if nested:
                out[key] = nested
        else:
            out[key] = _plain(item, sub, depth + 1, budget)
    return out


def _labels(value: object, path: str, budget: _Budget) -> Labels:
    """Labels as a set of (name, value) pairs: a missing or null value means ``""``."""
    if not isinstance(value, list | tuple):
        raise ValidationError(path, f"expected a list of labels, got {_kind_of(value)}")
    pairs: set[tuple[str, str]] = set()
    for i, item in enumerate(value):
        sub = f"{path}[{i}]"
        budget.spend(sub)
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ValidationError(sub, 'expected a mapping with a string "name"')
        for key in item:
            if key not in ("name", "value"):
                shown = _quote(key) if isinstance(key, str) else _kind_of(key)
                raise ValidationError(sub, f'unexpected key {shown} (a label has "name", "value")')
        label_value = item.get("value")
        if label_value is None:
            label_value = ""
        elif not isinstance(label_value, str):
            raise ValidationError(
                _join(sub, "value"), f"expected a string, got {_kind_of(label_value)}"
            )
        pairs.add((item["name"], label_value))
    return frozenset(pairs)


@dataclass
class _Node:
    """A checked node: `children` is None for a leaf; `fields` exclude name and children."""

    name: str
    fields: dict[str, Any]
    children: list[_Node] | None


class _Parser:
    """Checks the structure of trees and turns them into `_Node`s.

    One parser sees all the trees of one input, so that leaf names are unique across it.
    """

    def __init__(self, kind: TreeKind) -> None:
        self.kind = kind
        self.budget = _Budget()
        self.leaves: dict[str, str] = {}

    def node(self, raw: object, path: str, depth: int, parent: str | None) -> _Node:
        kind = self.kind
        if depth > MAX_DEPTH:
            raise ValidationError(path, f"the tree is deeper than {MAX_DEPTH} levels")
        if not isinstance(raw, Mapping):
            raise ValidationError(path, f"expected a mapping, got {_kind_of(raw)}")
        name: object = None
        children: object = None
        fields: dict[str, Any] = {}
        for key, value in raw.items():
            _check_key(key, path)
            self.budget.spend(path)
            if value is None:
                continue
            sub = _join(path, key)
            if key == kind.name_key:
                name = value
            elif key == kind.children_key:
                children = value
            elif key == kind.labels_key:
                labels = _labels(value, sub, self.budget)
                if labels:
                    fields[key] = labels
            elif isinstance(value, Mapping):
                nested = _fields(value, sub, 1, self.budget)
                if nested:
                    fields[key] = nested
            else:
                fields[key] = _plain(value, sub, 1, self.budget)

        name_path = _join(path, kind.name_key)
        if name is not None and not isinstance(name, str):
            raise ValidationError(name_path, f"expected a string, got {_kind_of(name)}")
        if children is None:
            return self._leaf(name, fields, path, name_path, parent)
        group = name if isinstance(name, str) else ""
        if group and not group.endswith("/"):
            raise ValidationError(
                name_path,
                f'group {_quote(group)} must end in "/" (only leaves have no "/" at the end)',
            )
        self._check_under(group, parent, name_path)
        misplaced = sorted(fields.keys() & kind.leaf_only)
        if misplaced:
            raise ValidationError(
                _join(path, misplaced[0]),
                f"a group must not carry {_quote(misplaced[0])}, only leaves may",
            )
        children_path = _join(path, kind.children_key)
        if not isinstance(children, list | tuple):
            raise ValidationError(
                children_path, f"expected a list of nodes, got {_kind_of(children)}"
            )
        nodes = [
            self.node(child, f"{children_path}[{i}]", depth + 1, group)
            for i, child in enumerate(children)
        ]
        return _Node(group, fields, nodes)

    def _leaf(
        self, name: object, fields: dict[str, Any], path: str, name_path: str, parent: str | None
    ) -> _Node:
        if not isinstance(name, str) or not name:
            raise ValidationError(name_path, "a leaf must have a non-empty name")
        if name.endswith("/"):
            raise ValidationError(
                name_path, f'leaf {_quote(name)} must not end in "/" (a group needs children)'
            )
        self._check_under(name, parent, name_path)
        if name in self.leaves:
            also = self.leaves[name] or "the root"
            raise ValidationError(name_path, f"duplicate leaf {_quote(name)} (also at {also})")
        self.leaves[name] = path
        return _Node(name, fields, None)

    @staticmethod
    def _check_under(name: str, parent: str | None, name_path: str) -> None:
        if parent is not None and not (name.startswith(parent) and len(name) > len(parent)):
            raise ValidationError(
                name_path, f"{_quote(name)} is not under the group {_quote(parent)}"
            )


def _roots(tree: object) -> list[tuple[object, str]]:
    """The trees of an input that is one tree or a list of them, with their paths."""
    if isinstance(tree, Mapping):
        return [(tree, "")]
    if isinstance(tree, list | tuple):
        return [(item, f"[{i}]") for i, item in enumerate(tree)]
    raise ValidationError("", f"expected a spec tree or a list of trees, got {_kind_of(tree)}")


def _parse(roots: Iterable[tuple[object, str]], kind: TreeKind) -> list[_Node]:
    parser = _Parser(kind)
    return [parser.node(raw, path, 0, None) for raw, path in roots]


def _merge(base: dict[str, Any], over: dict[str, Any], labels_key: str | None) -> dict[str, Any]:
    """`over` laid on `base`, nearer wins: mappings merge by key, labels unite."""
    out = dict(base)
    for key, value in over.items():
        prev = out.get(key)
        if key == labels_key and prev is not None:
            out[key] = prev | value
        elif isinstance(value, dict) and isinstance(prev, dict):
            out[key] = _merge(prev, value, None)
        else:
            out[key] = value
    return out


def _flatten(nodes: Iterable[_Node], kind: TreeKind) -> list[tuple[str, dict[str, Any]]]:
    """Every leaf with its inherited fields merged in, sorted by name."""
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(node: _Node, base: dict[str, Any]) -> None:
        fields = _merge(base, node.fields, kind.labels_key)
        if node.children is None:
            out.append((node.name, fields))
        else:
            for child in node.children:
                walk(child, fields)

    for node in nodes:
        walk(node, {})
    out.sort(key=lambda leaf: leaf[0])
    return out


def _ordered(keys: Iterable[str], order: tuple[str, ...]) -> list[str]:
    known = set(order)
    present = set(keys)
    return [k for k in order if k in present] + sorted(present - known)


def _render_value(value: Any) -> Any:
    """A fresh copy, so outputs never share (or alias) mutable parts."""
    if isinstance(value, dict):
        return {k: _render_value(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_render_value(v) for v in value]
    return value


def _render_labels(labels: Labels) -> list[dict[str, str]]:
    return [{"name": n, "value": v} if v else {"name": n} for n, v in sorted(labels)]


def _render_fields(
    fields: dict[str, Any], kind: TreeKind, order: tuple[str, ...], top: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _ordered(fields, order):
        value = fields[key]
        if top and key == kind.labels_key:
            out[key] = _render_labels(value)
        elif isinstance(value, dict):
            nested_order = kind.nested_order(key) if top else ()
            out[key] = _render_fields(value, kind, nested_order, False)
        else:
            out[key] = _render_value(value)
    return out


def _render_spec(name: str, fields: dict[str, Any], kind: TreeKind) -> dict[str, Any]:
    return {kind.name_key: name, **_render_fields(fields, kind, kind.key_order, True)}


def _render_node(node: _Node, kind: TreeKind) -> dict[str, Any]:
    """A node in canonical form: keys ordered, labels sorted, children last, by name."""
    out = _render_spec(node.name, node.fields, kind)
    if node.children is not None:
        children = sorted(node.children, key=lambda child: child.name)
        out[kind.children_key] = [_render_node(child, kind) for child in children]
    return out


def expand(tree: object, kind: TreeKind) -> list[dict[str, Any]]:
    """The flat specs a tree (or a list of trees) stands for, sorted by name.

    Each leaf's spec merges the fields of its ancestors and its own, nearer winning.
    Raises `ValidationError` with the path of the offending field for any bad structure.
    """
    return _expand_roots(_roots(tree), kind)


def _expand_roots(roots: Iterable[tuple[object, str]], kind: TreeKind) -> list[dict[str, Any]]:
    """`expand` of trees given with the paths their errors are reported at."""
    leaves = _flatten(_parse(roots, kind), kind)
    return [_render_spec(name, fields, kind) for name, fields in leaves]


def normalize(specs: object, kind: TreeKind) -> list[dict[str, Any]]:
    """Flat specs in the canonical form `expand` gives: unset keys dropped, labels sorted
    and deduplicated, keys ordered, the list sorted by name (trees are expanded)."""
    return expand(_as_list(specs), kind)


def canonicalize(tree: object, kind: TreeKind) -> Any:
    """A tree (or list of trees) checked and in canonical form, its shape unchanged:
    keys ordered, labels sorted, unset keys dropped, children sorted by name."""
    nodes = _parse(_roots(tree), kind)
    rendered = [_render_node(node, kind) for node in nodes]
    if isinstance(tree, Mapping):
        return rendered[0]
    return sorted(rendered, key=lambda node: str(node[kind.name_key]))


def _as_list(specs: object) -> list[Any] | Mapping[Any, Any]:
    """Accept any iterable of specs, but not a string (an iterable of characters)."""
    if isinstance(specs, Mapping):
        return specs
    if isinstance(specs, str | bytes) or not isinstance(specs, Iterable):
        raise ValidationError("", f"expected a list of specs, got {_kind_of(specs)}")
    return list(specs)


def _common_dir(a: str, b: str) -> str:
    """The longest ``/``-ended prefix shared by `a` and `b` (maybe ``""``)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[: a.rfind("/", 0, n) + 1]


def _build(leaves: list[tuple[str, dict[str, Any]]], depth: int) -> _Node:
    """The directory hierarchy of sorted, uniquely named leaves: one group for each
    ``/``-ended prefix where names branch, so no group ever has a single child."""
    if len(leaves) == 1:
        name, fields = leaves[0]
        return _Node(name, fields, None)
    prefix = _common_dir(leaves[0][0], leaves[-1][0])
    if depth >= MAX_DEPTH - 1:
        # Keep the folded tree within what `expand` accepts: the rest hang here flat.
        return _Node(prefix, {}, [_Node(n, f, None) for n, f in leaves])
    parts: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for leaf in leaves:
        rest = leaf[0][len(prefix) :]
        slash = rest.find("/")
        key = leaf[0] if slash < 0 else prefix + rest[: slash + 1]
        parts.setdefault(key, []).append(leaf)
    return _Node(prefix, {}, [_build(part, depth + 1) for part in parts.values()])


def _common(
    dicts: list[dict[str, Any]], skip: frozenset[str], labels_key: str | None
) -> dict[str, Any]:
    """What all of `dicts` have with equal values (into nested mappings; labels: the pairs
    all share)."""
    first, rest = dicts[0], dicts[1:]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key in skip or any(key not in d for d in rest):
            continue
        values = [value] + [d[key] for d in rest]
        if key == labels_key:
            shared = frozenset.intersection(*values)
            if shared:
                out[key] = shared
        elif all(isinstance(v, dict) for v in values):
            nested = _common(values, frozenset(), None)
            if nested:
                out[key] = nested
        elif all(_same(value, v) for v in values[1:]):
            out[key] = value
    return out


def _subtract(
    fields: dict[str, Any], common: dict[str, Any], labels_key: str | None
) -> dict[str, Any]:
    """`fields` without what `common` (taken from them by `_common`) already gives."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key not in common:
            out[key] = value
        elif key == labels_key:
            remaining = value - common[key]
            if remaining:
                out[key] = remaining
        elif isinstance(value, dict) and isinstance(common[key], dict):
            nested = _subtract(value, common[key], None)
            if nested:
                out[key] = nested
        # else: equal to the hoisted value, so inherited
    return out


def _hoist(node: _Node, kind: TreeKind) -> None:
    """Bottom-up, move what all children of a group share onto the group."""
    if not node.children:
        return
    for child in node.children:
        _hoist(child, kind)
    common = _common([c.fields for c in node.children], kind.leaf_only, kind.labels_key)
    node.fields = _merge(node.fields, common, kind.labels_key)
    for child in node.children:
        child.fields = _subtract(child.fields, common, kind.labels_key)


def fold(specs: object, kind: TreeKind) -> dict[str, Any]:
    """The smallest tree standing for flat specs: a group per shared ``/``-ended prefix,
    each holding what all its children share.

    The root is the group of the longest common prefix (``""`` if none), the lone spec
    itself if there is one, or an empty ``""`` group if there are none. Trees given as
    input are expanded first. ``expand(fold(specs)) == normalize(specs)``.
    """
    leaves = _flatten(_parse(_roots(_as_list(specs)), kind), kind)
    if not leaves:
        return {kind.name_key: "", kind.children_key: []}
    root = _build(leaves, 0)
    _hoist(root, kind)
    return _render_node(root, kind)
