"""A local Gazette cluster on embedded defaults: real components as child processes."""

from gazette.local.etcd import EmbeddedEtcd, find_etcd_binary
from gazette.local.process import ComponentError, Process, free_port

__all__ = ["ComponentError", "EmbeddedEtcd", "Process", "find_etcd_binary", "free_port"]
