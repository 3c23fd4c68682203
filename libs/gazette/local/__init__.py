"""Pieces of a local Gazette cluster on embedded defaults: a real etcd as a child process,
process helpers, and the tutorial's journals. ``gazette dev up`` (`gazette_dev`)
runs the cluster; tests start the same pieces."""

from gazette.local.etcd import EmbeddedEtcd, EtcdCluster, find_etcd_binary
from gazette.local.process import ComponentError, Process, free_port, log_tail
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS

__all__ = [
    "TUTORIAL_JOURNALS_YAML",
    "TUTORIAL_SELECTIONS",
    "ComponentError",
    "EmbeddedEtcd",
    "EtcdCluster",
    "Process",
    "find_etcd_binary",
    "free_port",
    "log_tail",
]
