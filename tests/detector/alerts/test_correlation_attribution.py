"""A correlation's alert describes the event that completed it: "Dataset modified while a
training job reads it" names the writer (user, job, process, file), not the reading job."""

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules

MODIFIED_WHILE_READ = "92ced819-f344-4ef6-92c1-7cf65fbff758"
DIRECTORY = "/lustre/datasets/imagenet/train/n01440764"


def _file_event(ts, action, pid, user, name, **extra):
    return {
        "@timestamp": f"2026-11-30T{ts}Z",
        "event.id": f"{action}-{pid}-{name}",
        "event.category": "file_access",
        "event.action": action,
        "host.name": "gpu-017",
        "process.pid": pid,
        "process.name": "python3",
        "user.name": user,
        "file.path": f"{DIRECTORY}/{name}",
        "file.directory": DIRECTORY,
        "hpcsec.asset.name": "imagenet",
        "hpcsec.asset.kind": "dataset",
        **extra,
    }


def _alerts(events):
    engine = Engine(load_rules([bundled_rules_dir() / "data_poisoning.yml"]))
    builder = AlertBuilder()
    builder.add(engine.evaluate(events) + engine.flush())
    return [a for a in builder.alerts() if a["rule.id"] == MODIFIED_WHILE_READ]


def test_modified_while_read_names_the_writer_not_the_reader():
    reads = [
        _file_event(f"01:00:0{n}", "read", 41000, "alice", f"{n}.JPEG", **{"slurm.job.id": "4242"})
        for n in range(3)
    ]
    write = _file_event(
        "01:03:00",
        "close_write",
        62100,
        "mallory",
        "1.JPEG",
        **{"slurm.job.id": "5151", "hpcsec.asset.write_allowed": False},
    )
    (alert,) = _alerts([*reads, write])
    assert alert["user.name"] == "mallory"
    assert alert["slurm.job.id"] == "5151"
    assert alert["process.pid"] == 62100
    assert alert["file.path"] == f"{DIRECTORY}/1.JPEG"
    assert alert["@timestamp"] == "2026-11-30T01:03:00.000Z"
    assert "mallory" in alert["alert.summary"] and "job 5151" in alert["alert.summary"]
    assert alert["alert.first_seen"] < "2026-11-30T01:03"  # the read is its evidence
    assert {e["user.name"] for e in alert["events"]} == {"alice", "mallory"}


def test_detection_alerts_still_describe_their_own_event():
    write = _file_event(
        "01:03:00",
        "close_write",
        62100,
        "mallory",
        "1.JPEG",
        **{"hpcsec.asset.write_allowed": False},
    )
    engine = Engine(load_rules([bundled_rules_dir() / "data_poisoning.yml"]))
    builder = AlertBuilder()
    builder.add(engine.evaluate([write]) + engine.flush())
    (alert,) = [a for a in builder.alerts() if a["rule.kind"] == "detection"]
    assert alert["user.name"] == "mallory" and alert["process.pid"] == 62100
