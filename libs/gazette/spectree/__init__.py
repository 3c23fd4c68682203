"""Hierarchical spec trees: flat journal or shard specs folded into the smallest tree
sharing common fields on ``/``-ended prefix groups, and expanded back.

Works on the plain dict (YAML) form; only the tree's structure is checked here.
"""

from gazette.spectree.kinds import JOURNALS, SHARDS, TreeKind
from gazette.spectree.tree import MAX_DEPTH, canonicalize, expand, fold, normalize
from gazette.spectree.yaml_io import dump_yaml, load_yaml

__all__ = [
    "JOURNALS",
    "MAX_DEPTH",
    "SHARDS",
    "TreeKind",
    "canonicalize",
    "dump_yaml",
    "expand",
    "fold",
    "load_yaml",
    "normalize",
]
