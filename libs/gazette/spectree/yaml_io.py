"""Spec trees as YAML text: what operators read and write with ``gazctl``-style tools.

Loading always ends in flat specs (trees are expanded) so callers validate one shape;
dumping writes a tree in canonical form so the same specs always read the same way.
"""

from __future__ import annotations

from typing import Any

import yaml

from gazette.errors import ValidationError
from gazette.spectree.kinds import TreeKind
from gazette.spectree.tree import _expand_roots, _join, _kind_of, canonicalize


class _Dumper(yaml.SafeDumper):
    """Safe dumper that never writes anchors and aliases: they confuse human editors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _parse_error(err: BaseException) -> ValidationError:
    """YAML errors name a line and column (1-based) so the user can find the mistake."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        what = "; ".join(str(p) for p in (err.context, err.problem) if p) or "invalid YAML"
        reason = f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    elif isinstance(err, RecursionError):
        reason = "nested too deeply"
    else:
        reason = str(err) or type(err).__name__
    result = ValidationError("yaml", reason)
    result.__cause__ = err
    return result


def load_yaml(text: str, kind: TreeKind) -> list[dict[str, Any]]:
    """The flat specs of one or more YAML documents, each a tree or a list of trees.

    Leaf names must be unique across all documents. With several documents, error paths
    start with ``document[i]``; YAML syntax errors have field ``yaml``.
    """
    if not isinstance(text, str):
        raise ValidationError("yaml", f"expected text, got {_kind_of(text)}")
    try:
        documents = list(yaml.safe_load_all(text))
    except Exception as err:  # PyYAML also lets ValueError (bad dates) etc. escape
        raise _parse_error(err) from err
    roots: list[tuple[object, str]] = []
    for i, document in enumerate(documents):
        path = f"document[{i}]" if len(documents) > 1 else ""
        if document is None:
            continue
        if isinstance(document, dict):
            roots.append((document, path))
        elif isinstance(document, list):
            roots.extend((tree, _join(path, f"[{j}]")) for j, tree in enumerate(document))
        else:
            raise ValidationError(
                path, f"expected a spec tree or a list of trees, got {_kind_of(document)}"
            )
    return _expand_roots(roots, kind)


def dump_yaml(tree_or_specs: object, kind: TreeKind) -> str:
    """A tree (or a list of trees or flat specs) as canonical block-style YAML.

    The input is checked like `expand` would; an empty list or an empty root group
    gives ``""``.
    """
    data = canonicalize(tree_or_specs, kind)
    if data == [] or data == {kind.name_key: "", kind.children_key: []}:
        return ""
    try:
        return yaml.dump(
            data,
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=True,
        )
    except yaml.YAMLError as err:
        raise ValidationError("", f"cannot be written as YAML: {err}") from err
