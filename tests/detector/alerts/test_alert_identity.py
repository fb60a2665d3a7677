"""The identity of a detection alert: repeats of one action fold, distinct actions (another
process, file or peer) are alerts of their own, whatever was done first."""

from __future__ import annotations

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.alerts.identity import (
    MAX_DISTINCT_PER_HOST,
    MAX_DISTINCT_PER_KEY,
    OVERFLOW_FIELD,
)
from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules

MODEL_RULE = """
title: Model weights read by an account not allowed for that model
id: 4c174e27-ed1a-4006-900a-52f92b9e8eb1
status: test
level: high
logsource: {product: hpc, category: file_access}
detection:
  sel:
    hpcsec.asset.kind: model
  condition: sel
"""
POOL_RULE = """
title: Connection to a mining pool port
id: f59bcccf-92ba-48c8-9f3e-1eb9599acd71
status: test
level: medium
logsource: {product: hpc, category: network_socket}
detection:
  sel:
    destination.port: [3333, 4444]
  condition: sel
"""
MODEL = "/lustre/models/llama-70b"


def _base(n: int, category: str, pid: int, name: str, **extra) -> dict:
    return {
        "@timestamp": f"2026-11-30T01:00:{n:02d}Z",
        "event.id": f"e{n}",
        "event.category": category,
        "event.action": "open",
        "host.name": "gpu-017",
        "hpcsec.sensor": category,
        "process.pid": pid,
        "process.name": name,
        "process.executable": f"/usr/bin/{name}",
        "user.name": "mallory",
        "slurm.job.id": "4250",
        **extra,
    }


def read(n: int, pid: int, name: str, path: str) -> dict:
    return _base(n, "file_access", pid, name, **{"file.path": path, "hpcsec.asset.kind": "model"})


def connect(n: int, pid: int, ip: str, port: int) -> dict:
    return _base(n, "network_socket", pid, "nc", **{"destination.ip": ip, "destination.port": port})


def matches(tmp_path, rule: str, events: list[dict]):
    path = tmp_path / "rules.yml"
    path.write_text(rule)
    return Engine(load_rules([path])).evaluate(events)


def test_a_harmless_read_first_does_not_hide_the_shards_copied_after_it(tmp_path):
    shards = [f"{MODEL}/model-0000{i}-of-00030.safetensors" for i in (1, 2, 3)]
    events = [read(0, 100, "python3", f"{MODEL}/config.json")]
    events += [
        read(1 + i, 101 + i, tool, p)
        for i, (tool, p) in enumerate(zip(["cp", "dd", "rsync"], shards, strict=True))
    ]
    events += [read(9, 100, "python3", f"{MODEL}/config.json")] * 4  # repeats of the first
    stage = AlertStage(SiteConfig())
    new = stage.fold(matches(tmp_path, MODEL_RULE, events))
    assert [(a["process.name"], a["file.path"]) for a in new] == [
        ("python3", f"{MODEL}/config.json"),
        ("cp", shards[0]),
        ("dd", shards[1]),
        ("rsync", shards[2]),
    ]
    sent = stage.conclude().send
    assert [a["count"] for a in sent] == [5, 1, 1, 1]  # only the repeats folded
    assert len({a["alert.id"] for a in sent}) == 4


def test_one_process_to_two_peers_and_two_processes_to_two_peers_are_distinct(tmp_path):
    events = [
        connect(0, 200, "203.0.113.50", 3333),
        connect(1, 201, "203.0.113.77", 4444),  # another nc, another pool
        connect(2, 200, "203.0.113.51", 3333),  # the first nc, another pool
        connect(3, 200, "203.0.113.50", 3333),  # a repeat
    ]
    builder = AlertBuilder()
    builder.add(matches(tmp_path, POOL_RULE, events))
    assert [(a["process.pid"], a["destination.ip"], a["count"]) for a in builder.alerts()] == [
        (200, "203.0.113.50", 2),
        (201, "203.0.113.77", 1),
        (200, "203.0.113.51", 1),
    ]


def test_the_process_name_stands_in_for_an_unreadable_executable(tmp_path):
    first = read(0, 300, "python3", f"{MODEL}/a")
    renamed = {**read(1, 300, "cat", f"{MODEL}/a")}
    del first["process.executable"], renamed["process.executable"]
    builder = AlertBuilder()
    builder.add(matches(tmp_path, MODEL_RULE, [first, renamed]))
    assert [a["process.name"] for a in builder.alerts()] == ["python3", "cat"]


def test_alert_ids_are_stable_for_the_same_action_and_window(tmp_path):
    events = [read(0, 100, "cp", f"{MODEL}/a"), read(1, 101, "cp", f"{MODEL}/b")]
    one, two = AlertBuilder(), AlertBuilder()
    one.add(matches(tmp_path, MODEL_RULE, events))
    two.add(matches(tmp_path, MODEL_RULE, events[::-1]))
    assert sorted(a["alert.id"] for a in one.alerts()) == sorted(
        a["alert.id"] for a in two.alerts()
    )


def test_a_rule_names_its_own_identity(tmp_path):
    events = [
        read(0, 100, "cp", f"{MODEL}/a"),
        read(1, 101, "dd", f"{MODEL}/a"),  # same file, another process
        read(2, 100, "cp", f"{MODEL}/b"),
    ]
    by_file = MODEL_RULE + "alert_identity: [file.path]\n"
    builder = AlertBuilder()
    builder.add(matches(tmp_path, by_file, events))
    assert [(a["file.path"], a["count"]) for a in builder.alerts()] == [
        (f"{MODEL}/a", 2),
        (f"{MODEL}/b", 1),
    ]
    per_job = AlertBuilder()  # an empty identity: host, job and user alone
    per_job.add(matches(tmp_path, MODEL_RULE + "alert_identity: []\n", events))
    assert [a["count"] for a in per_job.alerts()] == [3]
    malformed = AlertBuilder()  # not a list of field names: the default identity
    malformed.add(matches(tmp_path, MODEL_RULE + "alert_identity: file.path\n", events))
    assert len(malformed.alerts()) == 3


def test_distinct_actions_beyond_the_cap_fold_into_one_overflow_alert(tmp_path):
    n = MAX_DISTINCT_PER_KEY + 25
    events = [read(i % 60, 100, "find", f"{MODEL}/f{i}") for i in range(n)]
    builder = AlertBuilder()
    new = builder.add(matches(tmp_path, MODEL_RULE, events))
    assert len(new) == len(builder.alerts()) == MAX_DISTINCT_PER_KEY + 1
    overflow = builder.alerts()[-1]
    assert overflow[OVERFLOW_FIELD] is True and overflow["count"] == 25
    assert overflow["file.path"] == f"{MODEL}/f{MAX_DISTINCT_PER_KEY}"
    assert overflow["alert.summary"].startswith(f"More than {MAX_DISTINCT_PER_KEY} distinct")
    assert not any(OVERFLOW_FIELD in a for a in builder.alerts()[:-1])
    other_user = {**read(0, 900, "cp", f"{MODEL}/x"), "user.name": "bob"}
    assert len(builder.add(matches(tmp_path, MODEL_RULE, [other_user]))) == 1  # its own cap


def test_made_up_jobs_and_users_of_one_host_fold_into_its_overflow_alert(tmp_path):
    """A compromised node writes the job and user of its events: a distinct pair each time
    must not make an alert each time (nor keep one open each in the hub's memory)."""
    n = MAX_DISTINCT_PER_HOST + 40
    events = [
        {**read(i % 60, 100, "cp", f"{MODEL}/f{i % 3}"), "user.name": f"u{i}", "slurm.job.id": i}
        for i in range(n)
    ]
    builder = AlertBuilder()
    new = builder.add(matches(tmp_path, MODEL_RULE, events))
    assert len(new) == len(builder.alerts()) == MAX_DISTINCT_PER_HOST + 1
    overflow = builder.alerts()[-1]
    assert overflow[OVERFLOW_FIELD] is True and overflow["count"] == 40
    assert overflow["user.name"] == f"u{MAX_DISTINCT_PER_HOST}"  # the first folded in
    assert overflow["alert.summary"].startswith(
        f"More than {MAX_DISTINCT_PER_HOST} distinct alerts of this rule from one host"
    )
    assert len(builder._distinct) <= MAX_DISTINCT_PER_HOST + 1  # its bookkeeping too
    # repeats of an action already alerted on still fold into their own alert
    assert builder.add(matches(tmp_path, MODEL_RULE, events[:1])) == []
    assert builder.alerts()[0]["count"] == 2
    other_host = {**events[-1], "host.name": "gpu-018"}
    assert len(builder.add(matches(tmp_path, MODEL_RULE, [other_host]))) == 1  # its own bound


def test_a_key_past_its_cap_counts_once_against_the_host(tmp_path):
    """The per-key overflow alert is one alert of the host's, however much folds into it."""
    n = MAX_DISTINCT_PER_KEY + 500
    events = [read(i % 60, 100, "find", f"{MODEL}/f{i}") for i in range(n)]
    builder = AlertBuilder()
    builder.add(matches(tmp_path, MODEL_RULE, events))
    host = builder._distinct[next(k for k, v in builder._distinct.items() if v > 100)]
    assert host == MAX_DISTINCT_PER_KEY + 1
    assert len(builder.alerts()) == MAX_DISTINCT_PER_KEY + 1


def test_grown_hands_out_each_folded_alert_once(tmp_path):
    stage = AlertStage(SiteConfig())
    a, b = read(0, 100, "cp", f"{MODEL}/a"), read(1, 101, "cp", f"{MODEL}/b")
    stage.fold(matches(tmp_path, MODEL_RULE, [a, b]))
    assert stage.grown() == []  # new alerts are decided and stored as they are
    stage.fold(matches(tmp_path, MODEL_RULE, [a, a]))
    (grown,) = stage.grown()
    assert (grown["file.path"], grown["count"]) == (f"{MODEL}/a", 3)
    assert stage.grown() == []
