"""`hpcsec agent` as a real process: dedup folds repeats of one action and never distinct
actions, and the store keeps up with the outputs while the agent runs, not at shutdown."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpcsec.detector.store.alert_store import AlertQuery, Store, StoreError
from tests import slurm_harness
from tests.detector.runtime.agent_harness import (
    RULE_A_ID,
    AgentProcess,
    Node,
    Receiver,
    rule,
    wait_for,
)

READ_NOT_ALLOWED = f"""title: Model read by an account not allowed
id: {RULE_A_ID}
status: test
logsource:
  product: hpc
  category: file_access
detection:
  selection:
    hpcsec.asset.kind: model
    hpcsec.asset.read_allowed: false
  condition: selection
level: high
"""


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def stored_alerts(path: Path) -> dict[str, int] | None:
    """alert id -> count in the store, or None while the agent holds the file."""
    try:
        with Store(path, read_only=True, lock_wait_s=0.2) as db:
            return {a["alert.id"]: a["count"] for a in db.query_alerts(AlertQuery())}
    except StoreError:
        return None


@pytest.fixture
def model_tree():
    """A model directory any user can read (mkdtemp: pytest's own tmp is root's only)."""
    slurm_harness.ensure_users()
    top = Path(tempfile.mkdtemp(prefix="hpcsec-dedup-"))
    top.chmod(0o755)
    model = top / "llama"
    model.mkdir(mode=0o755)
    for name in ("config.json", *(f"model-0000{i}.safetensors" for i in (1, 2, 3))):
        (model / name).write_bytes(b"w" * 4096)
        (model / name).chmod(0o644)
    yield model
    shutil.rmtree(top, ignore_errors=True)


def as_alice(*argv: str) -> None:
    done = subprocess.run(["runuser", "-u", "alice", "--", *argv], capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and runuser need root")
def test_a_harmless_read_first_does_not_hide_the_shards_alice_copies_next(
    node: Node, model_tree: Path
):
    alice = pwd.getpwnam("alice")
    with open(node.etc / "passwd", "a") as passwd:  # the agent names alice from its etc root
        passwd.write(f"alice:x:{alice.pw_uid}:{alice.pw_gid}::/home/alice:/bin/sh\n")
    node.config.write_text(f"""dedup_window_s: 86400
assets:
  - name: llama
    kind: model
    paths: ["{model_tree}/**"]
    readers: {{users: [svc-train]}}
""")
    (node.rules / "file.yml").write_text(READ_NOT_ALLOWED)
    receiver = Receiver()
    agent = AgentProcess(
        node, "--output", receiver.url, "--interval", "3600", sensor="file_access", procfs="/proc"
    )
    shards = [model_tree / f"model-0000{i}.safetensors" for i in (1, 2, 3)]
    try:
        as_alice("cat", str(model_tree / "config.json"))
        wait_for(lambda: receiver.received, "the alert about config.json", check=agent)
        as_alice("dd", f"if={shards[0]}", "of=/dev/null", "status=none")
        as_alice("head", "-c", "4096", str(shards[1]))
        as_alice("tail", "-c", "4096", str(shards[2]))
        wait_for(
            lambda: {a.get("file.path") for a in node.file_alerts()} >= set(map(str, shards)),
            "an alert for every shard",
            check=agent,
        )
        assert agent.stop() == 0
    finally:
        agent.kill()
        receiver.stop()
    alerts = node.file_alerts()
    by_path = {a["file.path"]: a for a in alerts}
    assert sorted(by_path) == sorted([str(model_tree / "config.json"), *map(str, shards)])
    assert [by_path[str(s)]["process.name"] for s in shards] == ["dd", "head", "tail"]
    assert all(a["user.name"] == "alice" for a in alerts)
    assert sorted(receiver.received) == sorted(a["alert.id"] for a in alerts)  # every output


def test_repeats_fold_and_the_store_has_the_counts_while_the_agent_runs(node: Node):
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    store = node.root / "store.duckdb"
    node.start_process(4242, "cryptominer", 1)
    agent = AgentProcess(node, "--store", str(store))
    try:
        (first,) = wait_for(node.file_alerts, "the first alert", check=agent)
        # sampled every 0.3 s: the same process again and again is one alert whose count
        # reaches the store within seconds, with the agent still running
        wait_for(
            lambda: (stored_alerts(store) or {}).get(first["alert.id"], 0) >= 4,
            "the folded count in the store",
            check=agent,
        )
        node.start_process(4243, "cryptominer", 1)  # same rule, user and name: another process
        wait_for(lambda: len(node.file_alerts()) == 2, "the second process's alert", check=agent)
        sent = {a["alert.id"] for a in node.file_alerts()}
        wait_for(lambda: set(stored_alerts(store) or ()) == sent, "the store to match", check=agent)
        assert agent.proc.poll() is None
        assert agent.stop() == 0
    finally:
        agent.kill()
    alerts = node.file_alerts()
    assert [(a["process.pid"], a["count"]) for a in alerts] == [(4242, 1), (4243, 1)]
    final = stored_alerts(store)
    assert final is not None and set(final) == {a["alert.id"] for a in alerts}
    assert final[first["alert.id"]] >= 4
