"""The `cluster` key of the site config: the NATS servers the agent publishes to."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yml"
    path.write_text(text)
    return path


def test_cluster_nats_urls_are_read(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "cluster:\n  nats: [nats://a:4222, tls://b:4222]\n"))
    assert config.cluster_nats == ("nats://a:4222", "tls://b:4222")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("cluster:\n  nats: [http://a:4222]\n", 2),
        ("cluster:\n  nats: nats://a:4222\n  servers: 3\n", 3),
        ("cluster:\n  nats: [nats://]\n", 2),
    ],
)
def test_a_bad_cluster_key_names_its_line(tmp_path: Path, text: str, line: int) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert f"site.yml:{line}" in str(err.value)
