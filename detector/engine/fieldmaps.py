"""hpcsec field names as Elastic Common Schema (ECS) and Splunk Common Information Model (CIM)
spell them: the tables `rules convert` renames fields with and the Elasticsearch output writes
its documents by. Plain data, no pySigma: the outputs import it too (docs/integrations.md shows
both tables).

Fields a table does not name keep their hpcsec name: neither schema has GPU, RDMA, Slurm or
firmware fields, so those stay in their own namespaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final


@dataclass(frozen=True)
class FieldMap:
    """One schema: field renames and where the Sigma log source category goes."""

    name: str
    fields: MappingProxyType[str, str]
    category_field: str  # the field that says which kind of hpcsec event a record is
    category_value: str  # its value, with `{category}` (the rule's logsource category)

    def field(self, name: str) -> str:
        return self.fields.get(name, name)

    def category(self, category: str) -> str:
        return self.category_value.format(category=category)


# ECS already names most of our fields; what it does not have are our attributes inside its field
# sets (ECS reserves those sets: custom fields go to a namespace of their own, here `hpcsec.`).
# `event.category` holds ECS's own allowed values there, so ours goes to `event.dataset`.
ECS: Final = FieldMap(
    name="ecs",
    fields=MappingProxyType(
        {
            "process.is_gpu_service": "hpcsec.process.is_gpu_service",
            "process.cgroup": "hpcsec.process.cgroup",
            "process.env.LD_PRELOAD": "hpcsec.process.env.LD_PRELOAD",
            "process.env.SLURM_JOB_ID": "hpcsec.process.env.SLURM_JOB_ID",
            "process.env.CUDA_VISIBLE_DEVICES": "hpcsec.process.env.CUDA_VISIBLE_DEVICES",
            "user.is_admin": "hpcsec.user.is_admin",
            "user.is_system": "hpcsec.user.is_system",
            "destination.is_job_node": "hpcsec.destination.is_job_node",
            "network.state": "hpcsec.network.state",
            "network.inode": "hpcsec.network.inode",
            "file.access_count": "hpcsec.file.access_count",
            "file.target_path": "hpcsec.file.target_path",
            "group.id": "user.group.id",
        }
    ),
    category_field="event.dataset",
    category_value="hpcsec.{category}",
)

# CIM data models Endpoint (Processes, Filesystem, Ports) and Network_Traffic; the endpoint is
# `dest` in Endpoint. The log source is the sourcetype, as Splunk sites route data.
CIM: Final = FieldMap(
    name="cim",
    fields=MappingProxyType(
        {
            "host.name": "dest",
            "event.action": "action",
            "process.pid": "process_id",
            "process.name": "process_name",
            "process.executable": "process_path",
            "process.command_line": "process",
            "process.parent.pid": "parent_process_id",
            "user.name": "user",
            "user.id": "user_id",
            "group.id": "user_group_id",
            "file.path": "file_path",
            "file.name": "file_name",
            "file.size": "file_size",
            "source.ip": "src_ip",
            "source.port": "src_port",
            "destination.ip": "dest_ip",
            "destination.port": "dest_port",
            "network.transport": "transport",
            "network.bytes": "bytes",
            "network.packets": "packets",
            "network.state": "state",
        }
    ),
    category_field="sourcetype",
    category_value="hpcsec:{category}",
)

# Our own names: what `hpcsec collect` writes and the engine matches on.
HPCSEC: Final = FieldMap(
    name="hpcsec",
    fields=MappingProxyType({}),
    category_field="event.category",
    category_value="{category}",
)

FIELD_MAPS: Final = {m.name: m for m in (HPCSEC, ECS, CIM)}

# The schema a target's SIEM holds unless told otherwise (`rules convert --fields`).
DEFAULT_FIELD_MAP: Final = {
    "splunk": "cim",
    "lucene": "ecs",
    "esql": "ecs",
    "eql": "ecs",
    "elastalert": "ecs",
    "splunk_spl2": "cim",
}

# pip extras that install the pySigma backend of a target (pyproject.toml).
TARGET_EXTRAS: Final = {
    "splunk": "splunk",
    "lucene": "elasticsearch",
    "esql": "elasticsearch",
    "eql": "elasticsearch",
    "elastalert": "elasticsearch",
    "splunk_spl2": "splunk",
}
