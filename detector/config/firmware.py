"""Firmware policy: the golden version of each component per node class, and the versions
the site knows to be vulnerable."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.config.reader import ConfigReader
from hpcsec.detector.core.fields import FIRMWARE_COMPONENTS


@dataclass(frozen=True)
class FirmwarePolicy:
    baselines: dict[str, dict[str, str]] = field(default_factory=dict)
    vulnerable: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def baseline(self, node_class: str | None, component: str) -> str | None:
        return self.baselines.get(node_class or "", {}).get(component)

    def is_vulnerable(self, component: str, version: str) -> bool:
        return any(fnmatch.fnmatchcase(version, pat) for pat in self.vulnerable.get(component, ()))


def _version(r: ConfigReader, value: Any, node_class: Any, component: Any) -> str:
    keys = ("firmware", "baselines", node_class, component)
    where = f"firmware.baselines.{node_class}.{component}"
    if value is None or isinstance(value, (bool, list, dict)):
        raise r.fail(f"{where} must be a version string", *keys)
    if isinstance(value, float):  # YAML reads 2.10 as the number 2.1: the version is lost
        raise r.fail(
            f"{where}: quote the version ({value!r} was read as a number, which drops "
            "trailing zeros)",
            *keys,
        )
    return str(value)


def parse_firmware(r: ConfigReader, value: Any) -> FirmwarePolicy:
    fw = r.mapping(value, "firmware", allowed=("baselines", "vulnerable"))
    baselines = {}
    for cls, comps in r.mapping(fw.get("baselines"), "firmware", "baselines").items():
        comps = r.mapping(comps, "firmware", "baselines", cls, allowed=FIRMWARE_COMPONENTS)
        baselines[str(cls)] = {str(k): _version(r, v, cls, k) for k, v in comps.items()}
    vulnerable = {
        str(k): r.strings(v, "firmware", "vulnerable", k)
        for k, v in r.mapping(
            fw.get("vulnerable"), "firmware", "vulnerable", allowed=FIRMWARE_COMPONENTS
        ).items()
    }
    return FirmwarePolicy(baselines, vulnerable)
