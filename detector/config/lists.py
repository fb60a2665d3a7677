"""Named lists for Sigma `|expand` placeholders, with their defaults."""

from __future__ import annotations

from typing import Any

from hpcsec.detector.config.reader import ConfigReader

# Named lists the bundled rules use through `|expand` placeholders, with the defaults that
# apply when the site config's `lists:` does not name them (a site list replaces the default).
# Every default is non-empty: pySigma refuses to expand a placeholder into no values.
DEFAULT_LISTS: dict[str, tuple[str, ...]] = {
    "miner_names": (
        "xmrig",
        "xmr-stak",
        "t-rex",
        "nbminer",
        "lolminer",
        "gminer",
        "phoenixminer",
        "ethminer",
        "nanominer",
        "teamredminer",
        "bzminer",
        "rigel",
        "srbminer-multi",
        "cpuminer",
        "ccminer",
        "excavator",
    ),
    "copy_tools": (
        "scp",
        "sftp",
        "rsync",
        "rclone",
        "curl",
        "wget",
        "aws",
        "gsutil",
        "azcopy",
        "s5cmd",
        "s3cmd",
        "nc",
        "ncat",
        "socat",
        "lftp",
        "ftp",
        "croc",
        "magic-wormhole",
    ),
    "flash_tools": (
        "flint",
        "mstflint",
        "mstfwmanager",
        "mlxfwmanager",
        "mlxburn",
        "nvflash",
        "nvfwupd",
        "fwupdmgr",
        "fwupdtool",
        "flashrom",
        "afulnx_64",
        "nvidia-smi-flash",
    ),
    "service_commands": (
        "jupyter",
        "ray start",
        "raylet",
        "gcs_server",
        "ray.dashboard",
        "vllm",
        "tritonserver",
        "text-generation-launcher",
        "ollama serve",
        "gradio",
        "streamlit",
        "tensorboard",
        "code-server",
    ),
    "slurm_daemons": ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "slurmrestd"),
    # the accounts Slurm's daemons run as besides system ones (Debian's `slurm` is uid 64030)
    "slurm_users": ("slurm",),
    "ld_preload_allowed": (
        "libtcmalloc",
        "libjemalloc",
        "libdarshan",
        "libnvidia-ml",
        "libhugetlbfs",
        "libmimalloc",
        "libxalt",
        "libiomp5",
        "libtbbmalloc",
    ),
}


def parse_lists(r: ConfigReader, value: Any) -> dict[str, tuple[str, ...]]:
    lists = {str(k): r.strings(v, "lists", k) for k, v in r.mapping(value, "lists").items()}
    for k, v in lists.items():
        if not v:  # pySigma cannot expand a placeholder into no values
            raise r.fail(f"lists.{k} must not be empty (remove it to use the default)", "lists", k)
    return lists
