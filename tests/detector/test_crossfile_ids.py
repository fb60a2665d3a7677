"""crossfile.uuid_key reads a rule id or a correlation's reference exactly as `uuid.UUID` does
(pySigma compares them as UUIDs) while importing `uuid` only for a form that is not canonical."""

from __future__ import annotations

import subprocess
import sys
from uuid import UUID

import pytest

from hpcsec.detector.engine.crossfile import uuid_key

CANONICAL = "0c0c0c0c-0000-4000-8000-00000000000a"
TEXTS = [
    CANONICAL,
    CANONICAL.upper(),
    "{" + CANONICAL + "}",
    "urn:uuid:" + CANONICAL,
    CANONICAL.replace("-", ""),
    "0c0c-0c0c0000-4000-8000-00000000000a",  # four hyphens, not where the canonical form has them
    "0c0c0c0c-0000-4000-8000-00000000000a-",
    "0c0c0c0c-0000-4000-8000-0000000000-0a",
    "0c0c0c0c-0000-4000-8000-00000000000g",
    "0c0c0c0c-0000-4000-8000-0000000000_a",  # int() reads the underscore
    "0c0c0c0c-0000-4000-8000-+0000000000a",
    " 0c0c0c0c-0000-4000-8000-00000000000a",
    "0c0c0c0c-0000-4000-8000-\u0660000000000a0",  # an Arabic-Indic digit: int() reads it
    "0c0c0c0c\u20100000\u20104000\u20108000\u201000000000000a",  # look-alike hyphens
    "0c0c0c0c-0000-4000-8000-00000000000\uff41",  # fullwidth a
    "",
    "not_a_uuid",
    "gpu_burst_then_exfiltration_rule",  # a name of 32 characters
    "cluster_model_read_off_job_nodes",
    "0x0c0c0c0-0000-4000-8000-00000000000a",  # int() reads the 0x
    "+" + CANONICAL[1:],
    "\x1c" + CANONICAL[1:],  # str.isspace(): int() strips it
    "0c0c0c0c-0000-4000-8000-00000000000a\x85"[1:],
    "0c0c_0c0c-0000-4000-8000-00000000000a"[1:],
    "0c0c__0c0c-0000-4000-8000-0000000000a"[1:],
    "uuid:urn:" + CANONICAL,
    "urn:urn:uuid:" + CANONICAL.upper(),
    "{{" + CANONICAL + "}}",
    "{" + CANONICAL,
    "}" + CANONICAL + "{",
    "u{" + CANONICAL + "}",
    "urn:" + "{" + CANONICAL + "}",
    "{" + "urn:uuid:" + CANONICAL + "}",
    "{urn:uu" + "{id:" + CANONICAL + "}",
    "-" * 36,
]


def reference(text: str) -> str | None:
    try:
        return str(UUID(text))
    except ValueError:
        return None


@pytest.mark.parametrize("text", TEXTS)
def test_the_key_is_what_uuid_reads(text: str) -> None:
    assert uuid_key(text) == reference(text)


def test_ids_and_names_are_read_without_the_uuid_module() -> None:
    code = (
        "import sys\n"
        "from hpcsec.detector.engine.crossfile import uuid_key\n"
        f"assert uuid_key({CANONICAL!r}) == {CANONICAL!r}\n"
        f"assert uuid_key({TEXTS[2].upper()!r}) == {CANONICAL!r}\n"
        "assert uuid_key('gpu_burst') is None\n"
        "assert uuid_key('cluster_model_read_off_job_nodes') is None\n"
        "assert 'uuid' not in sys.modules\n"
        f"assert uuid_key({TEXTS[9]!r}) is not None\n"
        "assert 'uuid' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
