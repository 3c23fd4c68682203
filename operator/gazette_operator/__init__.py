"""The kopf operator: `JournalSpec` and `ShardSpec` resources into etcd specs.

`build_registry` makes the operator's kopf handlers (run by ``python -m
gazette_operator``); `sync` holds what they do (`declared`, `SpecWriter`), `ownership`
which resource owns which spec; `crds` generates the CustomResourceDefinitions from the
library's validation rules; `uninstall` is the chart's pre-delete hook. See
docs/operator.md.
"""

from gazette_operator.operator import Config, build_registry
from gazette_operator.ownership import Owner
from gazette_operator.sync import Declared, SpecWriter, declared

__all__ = ["Config", "Declared", "Owner", "SpecWriter", "build_registry", "declared"]
