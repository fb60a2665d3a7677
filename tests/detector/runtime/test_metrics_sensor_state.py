"""`hpcsec_sensor_state` tells a source that is not on this node from a sensor that fails."""

from __future__ import annotations

from prometheus_client import generate_latest

from hpcsec.detector.runtime.metrics import AgentMetrics


def _samples(metrics: AgentMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("hpcsec_sensor_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_unavailable_and_error_are_different_states():
    metrics = AgentMetrics()
    metrics.sensor_ran("gpu", "unavailable")
    metrics.sensor_ran("rdma_counters", "error")
    metrics.sensor_ran("process", "ok")
    metrics.sensor_ran("fanotify", "no such status")  # unknown: counted as failing
    got = _samples(metrics)
    assert got['hpcsec_sensor_state{sensor="gpu",state="unavailable"}'] == 1
    assert got['hpcsec_sensor_state{sensor="gpu",state="error"}'] == 0
    assert got['hpcsec_sensor_state{sensor="rdma_counters",state="error"}'] == 1
    assert got['hpcsec_sensor_state{sensor="rdma_counters",state="unavailable"}'] == 0
    assert got['hpcsec_sensor_state{sensor="process",state="ok"}'] == 1
    assert got['hpcsec_sensor_state{sensor="fanotify",state="error"}'] == 1
    # the old gauge keeps its meaning: 1 only when the last run was ok
    assert got['hpcsec_sensor_up{sensor="gpu"}'] == 0
    assert got['hpcsec_sensor_up{sensor="process"}'] == 1


def test_a_sensor_that_recovers_leaves_one_state_set():
    metrics = AgentMetrics()
    metrics.sensor_ran("gpu", "error")
    metrics.sensor_ran("gpu", "ok")
    got = _samples(metrics)
    states = {k: v for k, v in got.items() if k.startswith('hpcsec_sensor_state{sensor="gpu"')}
    assert sum(states.values()) == 1
    assert states['hpcsec_sensor_state{sensor="gpu",state="ok"}'] == 1
