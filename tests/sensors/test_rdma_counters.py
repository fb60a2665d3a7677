"""rdma_counters: procfs and node_exporter conformance, our node tree, deltas, bad values."""

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.sensors.base import FsRoot, SensorContext, SensorUnavailable
from hpcsec.sensors.rdma.counters import (
    RdmaCountersSensor,
    delta_fields,
    parse_rate,
    parse_state,
    read_ports,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CONFORMANCE = FIXTURES / "conformance"
# sha256 of every file of the data set as it was copied from upstream (see its README)
CONFORMANCE_SUMS = CONFORMANCE / "SHA256SUMS"
NODE = FIXTURES / "sysfs" / "h100-4hca"


def _ctx(sys_root, timestamp="2026-11-30T00:00:00.000Z", state=None):
    return SensorContext(
        "gpu-017",
        FsRoot("sys", sys_root),
        FsRoot("proc", sys_root),
        FsRoot("etc", sys_root),
        timestamp=timestamp,
        state=state if state is not None else {},
    )


def _by_port(root):
    return {(s.device, s.port): s for s in read_ports(FsRoot("sys", root))}


# --- prometheus/procfs: sysfs/class_infiniband_test.go --------------------------------------

PROCFS = json.loads((CONFORMANCE / "procfs/expected.json").read_text())


@pytest.mark.parametrize("case", PROCFS["rate_parse_cases"], ids=lambda c: c["rate"])
def test_rate_parse_cases_agree_with_procfs(case):
    assert parse_rate(case["rate"]) == case["bytes_per_second"]


def test_fixture_copy_is_byte_identical_to_the_upstream_data_set():
    """Nothing in fixtures/conformance was edited, added or lost since it was copied."""
    recorded = {}
    for line in CONFORMANCE_SUMS.read_text().splitlines():
        digest, name = line.split("  ", 1)
        recorded[name] = digest
    present = {
        str(path.relative_to(CONFORMANCE)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in CONFORMANCE.rglob("*")
        if path.is_file() and path != CONFORMANCE_SUMS
    }
    assert len(recorded) == 204
    assert present == recorded


def test_procfs_tree_agrees_with_every_asserted_value():
    root = CONFORMANCE
    expected = json.loads((root / "procfs/expected.json").read_text())
    ports = _by_port(root / "procfs/sys")
    expected_ports = {
        (dev, int(n)): p for dev, d in expected["devices"].items() for n, p in d["ports"].items()
    }
    assert set(ports) == set(expected_ports)
    for (dev, port), want in expected_ports.items():
        got = ports[(dev, port)].fields
        device = expected["devices"][dev]
        for name in ("fw_ver", "board_id", "hca_type", "node_guid"):
            if name in device["absent_files"]:
                assert f"rdma.{name}" not in got, (dev, name)
            else:
                assert got[f"rdma.{name}"] == device[name], (dev, name)
        assert got["rdma.device"] == want["name"]
        assert got["rdma.port"] == want["port"]
        assert got["rdma.link_layer"] == want["link_layer"]
        assert got["rdma.state"] == want["state"]
        assert got["rdma.state_id"] == want["state_id"]
        assert got["rdma.phys_state"] == want["phys_state"]
        assert got["rdma.phys_state_id"] == want["phys_state_id"]
        assert got["rdma.rate_bytes_per_s"] == want["rate_bytes_per_second"]
        # cmp.Diff over the whole struct: exactly these counters, nothing else.
        for section in ("counters", "hw_counters"):
            prefix = f"rdma.{section}."
            ours = {k[len(prefix) :]: v for k, v in got.items() if k.startswith(prefix)}
            assert ours == want.get(section, {}), (dev, port, section)
        # the 4-octet data counters: the sysfs file holds a quarter of the asserted bytes
        counters = root / f"procfs/sys/class/infiniband/{dev}/ports/{port}/counters"
        for name in want["multiplied_by_4"]:
            raw = int((counters / name).read_text())
            assert got[f"rdma.counters.{name}"] == raw * 4 == want["counters"][name]
        assert not any(k.startswith("rdma.counters_ext.") for k in got)
        assert "hpcsec.parse_errors" not in got


# --- prometheus/node_exporter: collector/fixtures/e2e-output.txt ----------------------------

# node_infiniband_<metric> -> our field (per port); all counters are in the e2e golden file.
NODE_EXPORTER_PORT_METRICS = {
    "legacy_data_received_bytes_total": "rdma.counters_ext.port_rcv_data_64",
    "legacy_data_transmitted_bytes_total": "rdma.counters_ext.port_xmit_data_64",
    "legacy_multicast_packets_received_total": "rdma.counters_ext.port_multicast_rcv_packets",
    "legacy_multicast_packets_transmitted_total": "rdma.counters_ext.port_multicast_xmit_packets",
    "legacy_packets_received_total": "rdma.counters_ext.port_rcv_packets_64",
    "legacy_packets_transmitted_total": "rdma.counters_ext.port_xmit_packets_64",
    "legacy_unicast_packets_received_total": "rdma.counters_ext.port_unicast_rcv_packets",
    "legacy_unicast_packets_transmitted_total": "rdma.counters_ext.port_unicast_xmit_packets",
    "link_downed_total": "rdma.counters.link_downed",
    "link_error_recovery_total": "rdma.counters.link_error_recovery",
    "multicast_packets_received_total": "rdma.counters.multicast_rcv_packets",
    "multicast_packets_transmitted_total": "rdma.counters.multicast_xmit_packets",
    "physical_state_id": "rdma.phys_state_id",
    "port_constraint_errors_received_total": "rdma.counters.port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "rdma.counters.port_xmit_constraint_errors",
    "port_data_received_bytes_total": "rdma.counters.port_rcv_data",
    "port_data_transmitted_bytes_total": "rdma.counters.port_xmit_data",
    "port_discards_received_total": "rdma.counters.port_rcv_discards",
    "port_discards_transmitted_total": "rdma.counters.port_xmit_discards",
    "port_errors_received_total": "rdma.counters.port_rcv_errors",
    "port_packets_received_total": "rdma.counters.port_rcv_packets",
    "port_packets_transmitted_total": "rdma.counters.port_xmit_packets",
    "port_transmit_wait_total": "rdma.counters.port_xmit_wait",
    "rate_bytes_per_second": "rdma.rate_bytes_per_s",
    "state_id": "rdma.state_id",
    "unicast_packets_received_total": "rdma.counters.unicast_rcv_packets",
    "unicast_packets_transmitted_total": "rdma.counters.unicast_xmit_packets",
}
INFO_LABELS = {
    "board_id": "rdma.board_id",
    "firmware_version": "rdma.fw_ver",
    "hca_type": "rdma.hca_type",
}
SAMPLE = re.compile(r"^node_infiniband_(\w+)\{([^}]*)\} (\S+)$")


def _exposition(root=CONFORMANCE):
    """(metric, labels, value) for every sample of the golden Prometheus exposition."""
    samples = []
    for line in (root / "node_exporter/expected-metrics.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
        samples.append((match[1], labels, float(match[3])))
    return samples


def test_node_exporter_exposition_has_the_documented_sample_count():
    assert len(_exposition()) == 51


def test_node_exporter_tree_agrees_with_every_sample():
    root = CONFORMANCE
    ports = _by_port(root / "node_exporter/sys")
    assert set(ports) == {("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)}
    seen = set()
    info_devices = set()
    for metric, labels, value in _exposition(root):
        if metric == "info":
            info_devices.add(labels["device"])
            device_ports = [s for (d, _), s in ports.items() if d == labels["device"]]
            assert device_ports, labels
            for sample in device_ports:
                for label, field in INFO_LABELS.items():
                    assert sample.fields[field] == labels[label], (labels, field)
            assert value == 1
            continue
        field = NODE_EXPORTER_PORT_METRICS[metric]
        fields = ports[(labels["device"], int(labels["port"]))].fields
        assert field in fields, (metric, labels)
        assert float(fields[field]) == value, (metric, labels)
        seen.add((labels["device"], int(labels["port"]), field))
    assert info_devices == {d for d, _ in ports}
    # The other direction: every mapped value we report is in the golden output, and every
    # counter we report has a node_exporter metric (none slips past the comparison).
    mapped = set(NODE_EXPORTER_PORT_METRICS.values())
    ours = {(d, p, k) for (d, p), s in ports.items() for k in s.fields if k in mapped}
    assert ours == seen
    unmapped = {
        k
        for s in ports.values()
        for k in s.fields
        if k.startswith(("rdma.counters", "rdma.hw_counters")) and k not in mapped
    }
    assert unmapped == set()
    # `N/A (no PMA)` (all of i40iw0) is absent, not a parse error
    assert [k for k, s in ports.items() if "hpcsec.parse_errors" in s.fields] == []


def test_i40iw_counters_all_na_are_left_out_not_errors():
    fields = _by_port(CONFORMANCE / "node_exporter/sys")[("i40iw0", 1)].fields
    assert not any(k.startswith(("rdma.counters", "rdma.hw_counters")) for k in fields)
    assert "hpcsec.parse_errors" not in fields
    assert fields["rdma.rate_bytes_per_s"] == 1_250_000_000
    assert (fields["rdma.state"], fields["rdma.phys_state"]) == ("ACTIVE", "LinkUp")


def test_saturated_and_above_32_bit_values_are_kept_as_is():
    fields = _by_port(CONFORMANCE / "node_exporter/sys")[("mlx4_0", 1)].fields
    assert fields["rdma.counters.port_xmit_wait"] == 4294967295
    assert fields["rdma.counters.port_rcv_packets"] == 6825908347
    assert fields["rdma.counters_ext.port_rcv_data_64"] == 4631917 * 4


# --- parsing helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,want",
    [
        ("400 Gb/sec (4X NDR)", 50_000_000_000),
        ("53.125 Gb/sec (1X HDR)", 6_640_625_000),
        ("10 Gb/sec (4X)", 1_250_000_000),
        ("", None),
        ("fast", None),
        ("-5 Gb/sec", None),
        ("nan Gb/sec", None),
        ("inf Gb/sec", None),
    ],
)
def test_parse_rate(text, want):
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("5: LinkUp", (5, "LinkUp")),
        (" 1 :  DOWN ", (1, "DOWN")),
        ("ACTIVE", None),
        ("x: ACTIVE", None),
        ("4:", None),
        ("-1: DOWN", None),
    ],
)
def test_parse_state(text, want):
    assert parse_state(text) == want


# --- our H100 node tree ----------------------------------------------------------------------


def test_h100_node_tree_one_event_per_port():
    events = RdmaCountersSensor().collect(_ctx(NODE / "sample0"))
    assert [(e["rdma.device"], e["rdma.port"]) for e in events] == [
        ("mlx5_0", 1),
        ("mlx5_1", 1),
        ("mlx5_2", 1),
        ("mlx5_3", 1),
    ]
    first = events[0]
    assert first["event.category"] == "rdma_counters"
    assert first["event.action"] == "sample"
    assert first["hpcsec.sensor"] == "rdma_counters"
    assert first["rdma.link_layer"] == "InfiniBand"
    assert first["rdma.rate_bytes_per_s"] == 50_000_000_000
    assert first["rdma.fw_ver"] == "28.39.1002"
    assert first["rdma.board_id"] == "MT_0000000838"
    assert first["rdma.hca_type"] == "MT4129"
    assert first["rdma.node_guid"] == "b83f:d203:00a1:3c40"
    assert first["rdma.counters.port_xmit_data"] == 93_458_221_733 * 4
    assert first["rdma.hw_counters.rx_write_requests"] == 1_523_881
    assert not any(k.startswith("rdma.delta.") for k in first)
    roce = events[3]
    assert roce["rdma.link_layer"] == "Ethernet"
    assert roce["rdma.rate_bytes_per_s"] == 25_000_000_000
    assert roce["rdma.hw_counters.np_cnp_sent"] == 1_204


def test_deltas_rates_and_reset_across_two_samples():
    state: dict = {}
    RdmaCountersSensor().collect(_ctx(NODE / "sample0", "2026-11-30T00:00:00.000Z", state))
    events = RdmaCountersSensor().collect(_ctx(NODE / "sample1", "2026-11-30T00:00:10.000Z", state))
    by_dev = {e["rdma.device"]: e for e in events}
    mlx0 = by_dev["mlx5_0"]
    assert mlx0["rdma.interval_s"] == 10.0
    # 3,125,000,000 words in 10 s = 12.5 GB in bytes, 1.25 GB/s.
    assert mlx0["rdma.delta.port_xmit_data"] == 12_500_000_000
    assert mlx0["rdma.per_s.port_xmit_data"] == 1_250_000_000.0
    assert mlx0["rdma.delta.hw.rx_read_requests"] == 40_000
    assert mlx0["rdma.per_s.hw.rx_read_requests"] == 4_000.0
    assert mlx0["rdma.delta.symbol_error"] == 0
    assert "rdma.reset" not in mlx0
    # mlx5_2 was reset between the samples (driver reload): counters listed, no delta.
    mlx2 = by_dev["mlx5_2"]
    assert mlx2["rdma.reset"] == [
        "port_rcv_data",
        "port_rcv_packets",
        "port_xmit_data",
        "port_xmit_packets",
    ]
    for name in mlx2["rdma.reset"]:
        assert f"rdma.delta.{name}" not in mlx2
        assert f"rdma.per_s.{name}" not in mlx2
    assert all(v >= 0 for k, v in mlx2.items() if k.startswith(("rdma.delta.", "rdma.per_s.")))
    assert state["rdma_counters"]["ports"]["mlx5_2/1"]["port_xmit_data"] == 1_000 * 4


def test_delta_fields_with_zero_interval_gives_deltas_but_no_rates():
    out = delta_fields({"a": 5, "hw.b": 9}, {"a": 7, "hw.b": 2, "new": 1}, 0.0)
    assert out == {"rdma.interval_s": 0.0, "rdma.delta.a": 2, "rdma.reset": ["hw.b"]}


# --- absent and malformed sources ------------------------------------------------------------


def test_absent_infiniband_class_is_unavailable(tmp_path):
    with pytest.raises(SensorUnavailable) as err:
        RdmaCountersSensor().collect(_ctx(tmp_path))
    assert str(err.value) == f"no RDMA devices under {tmp_path}/class/infiniband"


def test_malformed_values_are_skipped_and_named(tmp_path):
    shutil.copytree(NODE / "sample0/class/infiniband/mlx5_0", tmp_path / "class/infiniband/mlx5_0")
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "counters/symbol_error").write_text("abc\n")
    (port / "counters/link_downed").write_text("-1\n")
    (port / "counters/port_rcv_errors").write_text(f"{1 << 64}\n")
    (port / "counters/VL15_dropped").write_text("N/A (no PMA)\n")
    (port / "hw_counters/out_of_buffer").write_text("")
    (port / "rate").write_text("unknown\n")
    (port / "state").write_text("ACTIVE\n")
    (event,) = RdmaCountersSensor().collect(_ctx(tmp_path))
    base = "class/infiniband/mlx5_0/ports/1"
    assert event["hpcsec.parse_errors"] == [
        f"{base}/counters/link_downed",
        f"{base}/counters/port_rcv_errors",
        f"{base}/counters/symbol_error",
        f"{base}/hw_counters/out_of_buffer",
        f"{base}/rate",
        f"{base}/state",
    ]
    for gone in (
        "rdma.counters.symbol_error",
        "rdma.counters.link_downed",
        "rdma.counters.port_rcv_errors",
        "rdma.counters.VL15_dropped",
        "rdma.hw_counters.out_of_buffer",
        "rdma.rate_bytes_per_s",
        "rdma.state",
    ):
        assert gone not in event
    assert event["rdma.phys_state"] == "LinkUp"
    assert event["rdma.counters.port_xmit_packets"] == 2_917_455_210


def test_devices_without_ports_are_unavailable_not_an_empty_success(tmp_path):
    device = tmp_path / "class/infiniband/mlx5_0"
    device.mkdir(parents=True)
    (device / "fw_ver").write_text("28.39.1002\n")
    with pytest.raises(SensorUnavailable) as err:
        RdmaCountersSensor().collect(_ctx(tmp_path))
    assert str(err.value) == (
        f"RDMA devices under {tmp_path}/class/infiniband have no ports (mlx5_0)"
    )


# --- `hpcsec collect` as a user runs it ------------------------------------------------------


def test_collect_cli_prints_one_event_per_port(capsys):
    assert (
        cli.main(
            [
                "collect",
                "--sensor",
                "rdma_counters",
                "--raw",
                "--host-name",
                "gpu-017",
                "--sysfs-root",
                str(NODE / "sample0"),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert err == "hpcsec: sensor rdma_counters: ok: 4 events\n"
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["event.category"], r.get("rdma.device")) for r in records] == [
        ("rdma_counters", "mlx5_0"),
        ("rdma_counters", "mlx5_1"),
        ("rdma_counters", "mlx5_2"),
        ("rdma_counters", "mlx5_3"),
        ("sensor_status", None),
    ]
    assert records[0]["rdma.counters.port_rcv_data"] == 91_004_118_262 * 4


def test_collect_cli_without_infiniband_is_one_status_line_and_record(tmp_path, capsys):
    assert (
        cli.main(["collect", "--sensor", "rdma_counters", "--raw", "--sysfs-root", str(tmp_path)])
        == 0
    )
    out, err = capsys.readouterr()
    assert err == (
        "hpcsec: sensor rdma_counters: unavailable: no RDMA devices under "
        f"{tmp_path}/class/infiniband\n"
    )
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert (
        record["event.category"],
        record["event.action"],
        record["hpcsec.sensor"],
        record["message"],
    ) == (
        "sensor_status",
        "unavailable",
        "rdma_counters",
        f"no RDMA devices under {tmp_path}/class/infiniband",
    )


def test_collect_cli_wrong_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["collect", "--sensor", "rdma_countres"]) == 2
    assert capsys.readouterr().err.startswith(
        "hpcsec: error: unknown sensor rdma_countres (known: "
    )
    assert (
        cli.main(["collect", "--sensor", "rdma_counters", "--sysfs-root", str(tmp_path / "sys")])
        == 2
    )
    assert capsys.readouterr() == (
        "",
        f"hpcsec: error: --sysfs-root {tmp_path / 'sys'}: no such directory\n",
    )
    with pytest.raises(SystemExit) as exit_:  # argparse's own errors exit 2 as well
        cli.main(["collect", "--sensor", "rdma_counters", "--format", "csv"])
    assert exit_.value.code == 2


def test_counters_that_cannot_be_read_are_named_and_a_fifo_holds_no_read(tmp_path):
    """A listed counter that cannot be read (EIO from a failing firmware query; here a
    directory and a symlink loop) is named, not silently left out; a FIFO in a tree given
    as the root (no writer: a blocking read would wait for good) reads as empty."""
    import os
    import threading

    shutil.copytree(NODE / "sample0/class/infiniband/mlx5_0", tmp_path / "class/infiniband/mlx5_0")
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "counters/port_rcv_errors").unlink()
    (port / "counters/port_rcv_errors").mkdir()
    (port / "counters/loop_a").symlink_to("loop_b")
    (port / "counters/loop_b").symlink_to("loop_a")
    (port / "counters/symbol_error").unlink()
    os.mkfifo(port / "counters/symbol_error")
    found: list = []
    reader = threading.Thread(
        target=lambda: found.extend(RdmaCountersSensor().collect(_ctx(tmp_path))), daemon=True
    )
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "a FIFO held the read"
    (event,) = found
    base = "class/infiniband/mlx5_0/ports/1"
    assert event["hpcsec.parse_errors"] == [
        f"{base}/counters/loop_a (unreadable)",
        f"{base}/counters/loop_b (unreadable)",
        f"{base}/counters/port_rcv_errors (unreadable)",
        f"{base}/counters/symbol_error",  # empty: not a number
    ]
    assert event["rdma.counters.port_xmit_packets"] == 2_917_455_210
