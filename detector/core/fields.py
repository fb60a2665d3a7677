"""The field catalog: event categories, every event and alert field, and the fixed value sets.

A contract: docs/fields.md is generated from it (`python -m hpcsec.detector.core.fieldsdoc`),
the rule linter checks rule fields against it, and alerts copy the prefixes it names.
"""

from __future__ import annotations

from dataclasses import dataclass

PRODUCT = "hpc"

# Sigma logsource categories (= event.category values), with what produces them.
CATEGORIES: dict[str, str] = {
    "rdma_counters": "InfiniBand/RoCE port counters and hw_counters, one event per device and port",
    "rdma_qp": "RDMA queue pairs from `rdma -j res show qp`, with the owning process",
    "roce_flow": "RoCE v2 flows from a capture, per (source.ip, destination.ip, rdma.qp.dqpn) "
    "and interval",
    "gpu_device": "one event per GPU from NVML",
    "gpu_process": "one event per process on a GPU from NVML",
    "firmware": "one event per firmware component and device",
    "file_access": "accesses to protected paths, with the accessing process",
    "process": "processes from /proc",
    "network_socket": "TCP/UDP sockets with their owning process",
    "slurm_job": "Slurm jobs on this node: present, started, ended, epilog findings",
    "sensor_status": "a sensor's own status: ran, unavailable, failed, dropped records",
}

FILE_ACTIONS = ("open", "read", "write", "close_write", "create", "delete", "rename", "exec")
FIRMWARE_COMPONENTS = (
    "gpu_vbios",
    "gpu_inforom_image",
    "gpu_inforom_oem",
    "gpu_inforom_ecc",
    "gpu_inforom_power",
    "gpu_gsp",
    "gpu_driver",
    "hca",
    "nic",
    "bios",
)
LEVELS = ("informational", "low", "medium", "high", "critical")


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # keyword | long | double | boolean | date | ip | list | object
    description: str
    categories: tuple[str, ...] = ()  # empty: any category


def _f(name: str, type_: str, description: str, *categories: str) -> Field:
    return Field(name, type_, description, categories)


FIELDS: tuple[Field, ...] = (
    _f("@timestamp", "date", "time of the observation, RFC 3339 UTC"),
    _f("event.id", "keyword", "unique id of the event (stable for a replayed input)"),
    _f("event.kind", "keyword", "`event`, or `state` for sensor status records"),
    _f("event.category", "keyword", "the Sigma logsource category (see the table above)"),
    _f("event.action", "keyword", "what happened, e.g. `sample`, `open`, `started`"),
    _f("event.outcome", "keyword", "`success`, `failure` or `unknown` where it applies"),
    _f("host.name", "keyword", "the node the event was observed on"),
    _f("hpcsec.sensor", "keyword", "the sensor that produced the event"),
    _f("hpcsec.in_maintenance", "boolean", "the event falls in a maintenance window of the host"),
    _f("hpcsec.parse_errors", "list", "inputs skipped as malformed (file, record or packet)"),
    _f("message", "keyword", "human-readable detail (sensor status, epilog findings)"),
    # process and user (ECS)
    _f("process.pid", "long", "process id"),
    _f("process.name", "keyword", "short name (comm)"),
    _f("process.executable", "keyword", "absolute path of the executable"),
    _f("process.command_line", "keyword", "full command line, arguments joined by spaces"),
    _f("process.args", "list", "command line arguments"),
    _f(
        "process.executable_name",
        "keyword",
        "file name of the executable (not cut at 15 characters like `process.name`)",
    ),
    _f(
        "process.command_line_truncated",
        "boolean",
        "true when the command line was too long to keep whole: arguments were cut or left "
        "out (head, tail, flags, URLs and what the loaded rules look for are kept; markers "
        "say what is missing)",
    ),
    _f(
        "process.memory_read_stalled",
        "boolean",
        "true when a read of the process's arguments or environment (its own memory) did not "
        "return: they are left out while the read is stuck",
    ),
    _f(
        "process.memory_read_skipped",
        "boolean",
        "true when the process's arguments and environment were not read because reads of "
        "other processes of its owner are stuck (each such process has "
        "process.memory_read_stalled)",
    ),
    _f("process.parent.pid", "long", "parent process id"),
    _f("process.start", "date", "process start time"),
    _f("process.cgroup", "keyword", "cgroup path(s) of the process"),
    _f("process.env.LD_PRELOAD", "keyword", "LD_PRELOAD from the process environment"),
    _f("process.env.SLURM_JOB_ID", "keyword", "SLURM_JOB_ID from the process environment"),
    _f("process.env.CUDA_VISIBLE_DEVICES", "keyword", "CUDA_VISIBLE_DEVICES from the environment"),
    _f(
        "process.is_gpu_service",
        "boolean",
        "the process is a site-declared GPU service: its executable, run by root or a system uid",
    ),
    _f(
        "process.ld_preload_allowed",
        "boolean",
        "every library in `process.env.LD_PRELOAD` is allowed by the site (`ld_preload_allowed`)",
    ),
    _f("user.name", "keyword", "user name (from the node's passwd)"),
    _f("user.id", "long", "numeric uid"),
    _f("user.is_admin", "boolean", "the user is a site admin"),
    _f("user.is_system", "boolean", "uid below 1000"),
    _f("group.id", "long", "numeric gid"),
    # files
    _f("file.path", "keyword", "absolute path", "file_access"),
    _f("file.name", "keyword", "base name", "file_access"),
    _f(
        "file.directory",
        "keyword",
        "directory holding the file (`file.path` without its name)",
        "file_access",
    ),
    _f("file.extension", "keyword", "extension without the dot", "file_access"),
    _f("file.size", "long", "size in bytes", "file_access"),
    _f("file.target_path", "keyword", "new path of a rename", "file_access"),
    _f("file.access_count", "long", "repeated accesses folded into this event", "file_access"),
    _f(
        "hpcsec.asset.path",
        "keyword",
        "the protected file's own path, whatever path (bind mount, hard link, symlink) reached it",
        "file_access",
    ),
    _f("hpcsec.asset.name", "keyword", "the protected asset the path belongs to"),
    _f("hpcsec.asset.kind", "keyword", "model | dataset | checkpoint | secret"),
    _f("hpcsec.asset.read_allowed", "boolean", "the user or job account may read the asset"),
    _f("hpcsec.asset.write_allowed", "boolean", "the user or job account may write the asset"),
    # network
    _f("source.ip", "ip", "source address"),
    _f("source.port", "long", "source port"),
    _f("destination.ip", "ip", "destination address"),
    _f("destination.port", "long", "destination port"),
    _f("network.transport", "keyword", "tcp | udp"),
    _f("network.packets", "long", "packets in the flow interval", "roce_flow"),
    _f("network.bytes", "long", "bytes (whole frames) in the flow interval", "roce_flow"),
    _f("network.state", "keyword", "socket state, e.g. LISTEN, ESTABLISHED", "network_socket"),
    _f("network.inode", "long", "socket inode", "network_socket"),
    _f("destination.is_job_node", "boolean", "the peer address belongs to a node of the job"),
    # GPU
    _f("gpu.index", "long", "NVML index"),
    _f("gpu.uuid", "keyword", "GPU UUID"),
    _f("gpu.serial", "keyword", "board serial"),
    _f("gpu.name", "keyword", "product name"),
    _f("gpu.pci_bus_id", "keyword", "PCI address in sysfs form, e.g. 0000:1a:00.0"),
    _f("gpu.minor", "long", "minor number (/dev/nvidiaN)"),
    _f("gpu.mig_mode", "long", "1 when MIG is enabled"),
    _f("gpu.ecc_mode", "long", "1 when ECC is enabled"),
    _f("gpu.memory_total_bytes", "long", "total memory"),
    _f("gpu.memory_used_bytes", "long", "used memory (device) or memory of the process"),
    _f("gpu.utilization_percent", "long", "GPU utilisation"),
    _f("gpu.process_type", "keyword", "compute | graphics | mps", "gpu_process"),
    _f("gpu.instance_id", "long", "MIG GPU instance", "gpu_process"),
    _f("gpu.compute_instance_id", "long", "MIG compute instance", "gpu_process"),
    _f("gpu.allocated_to_job", "boolean", "the GPU is in the allocation of the process's job"),
    _f("gpu.process_users", "list", "users with processes on this GPU", "gpu_device"),
    _f("gpu.process_user_count", "long", "distinct users with processes on this GPU", "gpu_device"),
    _f("gpu.process_count", "long", "processes NVML lists on this GPU", "gpu_device"),
    _f("gpu.driver_version", "keyword", "NVIDIA driver version"),
    # RDMA
    _f("rdma.device", "keyword", "RDMA device, e.g. mlx5_0"),
    _f("rdma.port", "long", "port number"),
    _f("rdma.link_layer", "keyword", "InfiniBand | Ethernet"),
    _f("rdma.state", "keyword", "port state name, e.g. ACTIVE"),
    _f("rdma.phys_state", "keyword", "physical state name, e.g. LinkUp"),
    _f("rdma.rate_bytes_per_s", "long", "link rate in bytes/s"),
    _f("rdma.fw_ver", "keyword", "HCA firmware version"),
    _f("rdma.board_id", "keyword", "board id (PSID)"),
    _f("rdma.hca_type", "keyword", "HCA type"),
    _f("rdma.node_guid", "keyword", "node GUID"),
    _f("rdma.state_id", "long", "port state number, e.g. 4 (ACTIVE)"),
    _f("rdma.phys_state_id", "long", "physical state number, e.g. 5 (LinkUp)"),
    _f("rdma.counters.*", "long", "sysfs counters/ (data counters in bytes)", "rdma_counters"),
    _f("rdma.hw_counters.*", "long", "sysfs hw_counters/", "rdma_counters"),
    _f(
        "rdma.counters_ext.*",
        "long",
        "sysfs counters_ext/ (legacy 64-bit; data in bytes)",
        "rdma_counters",
    ),
    _f(
        "rdma.delta.*",
        "long",
        "increase since the previous sample: `<file>` for counters/, "
        "`hw.<file>` for hw_counters/, `ext.<file>` for counters_ext/",
        "rdma_counters",
    ),
    _f("rdma.per_s.*", "double", "increase per second, named as rdma.delta.*", "rdma_counters"),
    _f("rdma.reset", "list", "counters that went backwards (reset) since the last sample"),
    _f("rdma.interval_s", "double", "seconds since the previous sample", "rdma_counters"),
    _f("rdma.qp.lqpn", "long", "local QP number", "rdma_qp"),
    _f("rdma.qp.rqpn", "long", "remote QP number", "rdma_qp"),
    _f("rdma.qp.type", "keyword", "RC, UC, UD, GSI, SMI, XRC_INI…", "rdma_qp"),
    _f("rdma.qp.state", "keyword", "RESET, INIT, RTR, RTS…", "rdma_qp"),
    _f("rdma.qp.kernel", "boolean", "the QP is owned by the kernel (no process)", "rdma_qp"),
    _f(
        "rdma.qp.kernel_owner",
        "keyword",
        "kernel module owning a kernel QP, e.g. ib_core",
        "rdma_qp",
    ),
    _f("rdma.qp.pdn", "long", "protection domain number", "rdma_qp"),
    _f(
        "rdma.qp.not_listed",
        "long",
        "on the last QP listed of a process and device: its QPs past the 256 listed each "
        "sample, counted only (a user may create thousands)",
        "rdma_qp",
    ),
    _f("rdma.qp.sq_psn", "long", "send queue packet sequence number", "rdma_qp"),
    _f("rdma.qp.rq_psn", "long", "receive queue packet sequence number", "rdma_qp"),
    _f("rdma.qp.path_mig_state", "keyword", "MIGRATED, REARM or ARMED", "rdma_qp"),
    _f("rdma.qp.dqpn", "long", "destination QP of the flow (BTH)", "roce_flow"),
    _f("rdma.flow.write_requests", "long", "RDMA WRITE FIRST/ONLY packets", "roce_flow"),
    _f("rdma.flow.write_bytes", "long", "sum of RETH lengths of writes", "roce_flow"),
    _f("rdma.flow.read_requests", "long", "RDMA READ REQUEST packets", "roce_flow"),
    _f("rdma.flow.read_bytes", "long", "sum of RETH lengths of read requests", "roce_flow"),
    _f("rdma.flow.atomic_requests", "long", "atomic requests", "roce_flow"),
    _f("rdma.flow.sends", "long", "SEND packets", "roce_flow"),
    _f("rdma.flow.acks", "long", "ACK packets", "roce_flow"),
    _f(
        "rdma.flow.naks",
        "long",
        "ACK packets carrying a NAK (e.g. remote access error)",
        "roce_flow",
    ),
    _f("rdma.flow.rkeys", "long", "distinct rkeys seen", "roce_flow"),
    _f("rdma.flow.interval_s", "double", "aggregation interval", "roce_flow"),
    # firmware
    _f("firmware.component", "keyword", "one of " + ", ".join(FIRMWARE_COMPONENTS), "firmware"),
    _f("firmware.device", "keyword", "GPU uuid, mlx5_0, eth0 or system", "firmware"),
    _f("firmware.version", "keyword", "version string as reported", "firmware"),
    _f("firmware.previous_version", "keyword", "version at the previous sample", "firmware"),
    _f("firmware.board_id", "keyword", "board id of the device (HCA PSID)", "firmware"),
    _f("firmware.driver", "keyword", "kernel driver of a NIC (ethtool)", "firmware"),
    _f("firmware.vendor", "keyword", "BIOS vendor (DMI)", "firmware"),
    _f("firmware.release_date", "keyword", "BIOS release date as DMI reports it", "firmware"),
    _f("firmware.board_name", "keyword", "mainboard name (DMI board_name)", "firmware"),
    _f("firmware.product_name", "keyword", "system product name (DMI product_name)", "firmware"),
    _f("firmware.baseline_version", "keyword", "golden version for the node class", "firmware"),
    _f("firmware.drift", "boolean", "version differs from the baseline", "firmware"),
    _f("firmware.changed", "boolean", "version differs from the previous sample", "firmware"),
    _f("firmware.known_vulnerable", "boolean", "version on the site's vulnerable list", "firmware"),
    _f(
        "firmware.fleet_majority_version", "keyword", "most common version across hosts", "firmware"
    ),
    # Slurm
    _f("slurm.job.id", "keyword", "job id (absent when the event has no job)"),
    _f("slurm.job.id_source", "keyword", "cgroup | listpids | environ (environ is forgeable)"),
    _f("slurm.job.user", "keyword", "job owner"),
    _f("slurm.job.account", "keyword", "Slurm account"),
    _f("slurm.job.partition", "keyword", "partition"),
    _f("slurm.job.nodes", "list", "nodes of the job, hostlist expanded"),
    _f("slurm.job.gpus", "list", "GPU indices allocated to the job on this node"),
    _f("slurm.job.state", "keyword", "RUNNING, COMPLETED…"),
    _f("slurm.job.start", "date", "job start time"),
    _f("slurm.job.end", "date", "job end time"),
    _f("slurm.job.step", "keyword", "step id (batch, extern, 0, …)"),
    _f("slurm.job.name", "keyword", "job name"),
    _f(
        "slurm.job.listing_tampered",
        "boolean",
        "the job's own text broke the lines of `scontrol show job -d` (GPUs unknown)",
        "slurm_job",
    ),
    _f("slurm.node.users", "list", "users with a job on this node", "slurm_job"),
    _f("slurm.node.job_count", "long", "running jobs on this node (node-level events)"),
    _f("slurm.node.user_has_job", "boolean", "the event's user has a running job on this node"),
    _f("hpcsec.findings", "list", "what the epilog found left behind", "slurm_job"),
    # set by the cluster hub (`hpcsec hub`), which sees every node's firmware
    _f("hpcsec.cluster.node_class", "keyword", "hub: product, board name or board id", "firmware"),
    _f("hpcsec.cluster.class_hosts", "long", "hub: hosts of the node class seen", "firmware"),
    _f(
        "hpcsec.cluster.firmware_majority_version",
        "keyword",
        "hub: version most hosts of the node class run (3+ hosts, over half)",
        "firmware",
    ),
)

FIELD_BY_NAME = {f.name: f for f in FIELDS}
FIELD_PREFIXES = tuple(f.name[:-1] for f in FIELDS if f.name.endswith(".*"))

# Alert schema (contract): these keys, plus the slurm.job.*, user.*, gpu.* and process.*
# fields of the triggering event when present; also its file, peer, firmware, RDMA device
# and asset fields, so an alert reads on its own in a SIEM without opening `events`.
ALERT_FIELDS: tuple[Field, ...] = (
    Field(
        "alert.id",
        "keyword",
        "stable id: same rule, identity (grouping key) and window give the same id",
    ),
    Field(
        "@timestamp",
        "date",
        "time of the (first) triggering event; for a correlation, of the event that completed it",
    ),
    Field("rule.id", "keyword", "Sigma rule id"),
    Field("rule.title", "keyword", "rule title"),
    Field("rule.level", "keyword", "informational | low | medium | high | critical"),
    Field("rule.tags", "list", "ATT&CK / ATLAS tags"),
    Field("rule.vector", "keyword", "threat vector: the ruleset file's stem"),
    Field("host.name", "keyword", "node"),
    Field("events", "list", "the matching events, whole"),
    Field("count", "long", "matches folded into this alert by dedup"),
    Field("rule.kind", "keyword", "`detection` or `correlation`"),
    Field(
        "alert.summary",
        "keyword",
        "one line for people: the rule's `summary` template or "
        "user, job, process and object of the first event",
    ),
    Field("alert.first_seen", "date", "time of the first event folded into this alert"),
    Field("alert.last_seen", "date", "time of the last event folded into this alert"),
    Field("alert.group", "object", "correlations: the `group-by` values of the group that fired"),
    Field("alert.value", "double", "correlations: the count, sum or average that fired"),
    Field("alert.hosts", "list", "cluster hub correlations: the hosts of the evidence events"),
    Field("alert.events_truncated", "boolean", "`events` holds only the first matching events"),
    Field(
        "alert.distinct_overflow",
        "boolean",
        "more distinct actions of one rule, host, job and user (or alerts of one rule and "
        "host) in a window than dedup keeps apart were folded into this alert",
    ),
    Field(
        "incident.id",
        "keyword",
        "alerts to triage together share it: same node and job, or same user and process "
        "without a job, or a correlation and its steps' alerts (docs/report.md)",
    ),
    Field("rule.description", "keyword", "what the rule detects and why it matters"),
    Field("rule.falsepositives", "list", "known benign causes, from the rule"),
    Field("rule.references", "list", "links to background on the technique"),
    Field(
        "rule.response",
        "keyword",
        "the rule's `response` note: what to check and how to contain it",
    ),
    Field(
        "rule.techniques",
        "list",
        "ATT&CK / ATLAS techniques of `rule.tags`: `{id, name}` (name null when not in the "
        "bundled table)",
    ),
    Field("rule.tactics", "list", "ATT&CK / ATLAS tactics of `rule.tags`: `{id, name}`"),
)
ALERT_COPIED_PREFIXES = (
    "slurm.job.",
    "user.",
    "gpu.",
    "process.",
    "file.",
    "destination.",
    "firmware.",
    "rdma.device",
    "hpcsec.asset.",
)


def is_known_field(name: str) -> bool:
    return name in FIELD_BY_NAME or name.startswith(FIELD_PREFIXES)
