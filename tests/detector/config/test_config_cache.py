"""The parsed-config cache: a config read again with the same bytes skips PyYAML, gives the same
SiteConfig and the same errors, and an entry that is not ours, not a regular file, damaged or
forged is never believed.

Most tests plant a *genuine-looking* entry (right name, right checksum) whose document differs
from the file (`dedup_window_s: 999` where the file says 300): a config that comes back with
999 was read from the cache, one with 300 was parsed from the file.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpcsec.detector.config import doccache
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.errors import ConfigError
from hpcsec.detector.core.yamldoc import YamlDocument

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "site-config.yml"
TEXT = (
    "dedup_window_s: 300\n"
    "maintenance:\n  - start: 2026-12-01T02:00:00Z\n    end: 2026-12-01T06:00:00Z\n"
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return doccache.default_dir()


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "site.yml"
    path.write_text(TEXT)
    return path


def entries(cache: Path) -> list[str]:
    return sorted(os.listdir(cache)) if cache.exists() else []


def plant(cache: Path, raw: bytes, dedup: int = 999) -> Path:
    """A well-formed entry for `raw` whose document says `dedup_window_s: dedup`."""
    name = doccache.entry_name(raw)
    assert name is not None
    doc = YamlDocument({"dedup_window_s": dedup}, "-", 1, {("dedup_window_s",): 1})
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache.chmod(0o700)
    (cache / name).write_bytes(doccache.encode(name, doc))
    (cache / name).chmod(0o600)
    return cache / name


def test_a_second_load_reads_the_cached_document_and_gives_the_same_config(cache):
    cold = load_config(EXAMPLE)
    assert len(entries(cache)) == 1
    (name,) = entries(cache)
    stored = doccache.decode(name, (cache / name).read_bytes(), str(EXAMPLE))
    assert stored is not None and stored.lines  # the line map travels with the value
    warm = load_config(EXAMPLE)
    assert warm == cold
    assert warm.name_lines == cold.name_lines and warm.path == str(EXAMPLE)


def test_yaml_timestamps_come_back_as_the_same_datetimes(cache, config):
    cold = load_config(config)
    warm = load_config(config)
    assert warm.maintenance == cold.maintenance
    assert warm.maintenance[0].start == datetime(2026, 12, 1, 2, tzinfo=UTC)


def test_the_planted_probe_is_read_when_the_entry_is_trusted(cache, config):
    """What every refusal below is measured against: the same entry, trusted, is used."""
    plant(cache, config.read_bytes())
    assert load_config(config).dedup_window_s == 999
    assert load_config(config, cache=False).dedup_window_s == 300


def test_any_byte_change_is_another_entry(cache, config):
    plant(cache, config.read_bytes())
    config.write_text(TEXT.replace("300", "301"))
    assert load_config(config).dedup_window_s == 301
    config.write_text(TEXT + " ")  # a trailing space: same YAML value, other bytes
    assert load_config(config).dedup_window_s == 300
    assert len(entries(cache)) == 3


def test_a_config_with_a_mistake_gets_no_entry_and_the_same_error_each_time(cache, tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("dedup_window_s: 300\nspool:\n  max_bytes: 12\n")
    errors = []
    for _ in range(2):
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        errors.append(str(exc.value))
    with pytest.raises(ConfigError) as uncached:
        load_config(path, cache=False)
    assert errors == [str(uncached.value)] * 2
    assert errors[0].startswith(f"{path}:3:")
    assert entries(cache) == []


def test_a_yaml_syntax_error_is_reported_as_before(cache, tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("assets:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yml:\d+:\d+: YAML syntax error"):
        load_config(path)
    assert entries(cache) == []


def test_the_document_takes_the_path_it_is_read_from(cache, config, tmp_path):
    """The same bytes under another name: errors and `rules:` paths follow the new path."""
    load_config(config)
    other = tmp_path / "elsewhere" / "copy.yml"
    other.parent.mkdir()
    other.write_text(TEXT + "rules: [local]\n")
    load_config(other)
    again = load_config(other)
    assert again.path == str(other) and again.rule_paths == (str(other.parent / "local"),)


def test_a_corrupt_entry_is_removed_and_the_file_parsed(cache, config):
    entry = plant(cache, config.read_bytes())
    entry.write_bytes(entry.read_bytes()[:-7])
    assert load_config(config).dedup_window_s == 300
    # the damaged entry gave way to the file's own
    assert doccache.decode(entry.name, entry.read_bytes(), "x").data["dedup_window_s"] == 300


def test_an_entry_with_a_wrong_checksum_is_refused(cache, config):
    entry = plant(cache, config.read_bytes())
    fmt, digest, payload = pickle.loads(entry.read_bytes())
    forged = payload.replace(b"\xe7\x03", b"\xe8\x03")  # 999 -> 1000, checksum unchanged
    entry.write_bytes(pickle.dumps((fmt, digest, forged)))
    assert load_config(config).dedup_window_s == 300


def test_an_entry_renamed_from_another_file_is_refused(cache, config):
    """A genuine entry of other bytes, put under this file's name: its own name is inside."""
    other = plant(cache, b"other bytes")
    os.replace(other, cache / doccache.entry_name(config.read_bytes()))
    assert load_config(config).dedup_window_s == 300


class _RunsCode:
    """Unpickled by a plain unpickler, this would create a directory."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_forged_pickle_cannot_run_code(cache, config, tmp_path):
    marker = tmp_path / "code-ran"
    evil = pickle.dumps(_RunsCode(marker))
    # the code in the outer pickle, and in a payload whose checksum is right
    for forged in (evil, pickle.dumps((doccache.FORMAT, hashlib.sha256(evil).digest(), evil))):
        plant(cache, config.read_bytes()).write_bytes(forged)
        assert load_config(config).dedup_window_s == 300
        assert not marker.exists()


def test_a_symlinked_entry_is_not_followed(cache, config, tmp_path):
    entry = plant(cache, config.read_bytes())
    outside = tmp_path / "outside"
    shutil.move(entry, outside)
    entry.symlink_to(outside)
    assert load_config(config).dedup_window_s == 300


def test_a_symlinked_cache_directory_is_not_used(cache, config, tmp_path):
    real = tmp_path / "real-cache"
    plant(real, config.read_bytes())
    cache.parent.mkdir(parents=True)
    cache.symlink_to(real)
    assert load_config(config).dedup_window_s == 300


def test_a_cache_directory_open_to_others_is_not_used(cache, config):
    plant(cache, config.read_bytes())
    cache.chmod(0o755)
    assert load_config(config).dedup_window_s == 300
    assert len(entries(cache)) == 1  # and nothing is written there either


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_an_entry_of_another_user_is_not_used(cache, config):
    os.chown(plant(cache, config.read_bytes()), 65534, 65534)
    assert load_config(config).dedup_window_s == 300


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_a_cache_directory_of_another_user_is_not_used(cache, config):
    plant(cache, config.read_bytes())
    os.chown(cache, 65534, 65534)
    assert load_config(config).dedup_window_s == 300


def test_without_a_home_directory_the_config_is_read_uncached(config, monkeypatch):
    """A service user with no HOME and no passwd entry: Path.home() fails; the config is
    still read (the cache only saves time)."""
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setattr("pwd.getpwuid", no_entry)
    assert load_config(config).dedup_window_s == 300
    assert load_config(config).dedup_window_s == 300
