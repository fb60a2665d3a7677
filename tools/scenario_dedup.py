"""Attack scenarios about what dedup must not hide: distinct actions of one job and user.

An attacker who knows that alerts fold on (rule, host, job, user) does something harmless
first so that the one alert the SOC sees names it; every later action only grows a count.
The alert identity (detector/alerts/identity.py) makes each distinct process, file and peer
an alert of its own, and folds only repeats. `distinct` in an expected alert lists values
that must each be named by an alert of that rule (tests/test_scenarios.py).
"""

from __future__ import annotations

from scenario_attacks import LLAMA70, shards
from scenario_common import alert, node_sample
from scenario_node_attacks import MALLORY_JOB, scenario, times
from snapshot_model import FileAccess, Proc, Scenario, Sock

POOLS = (("203.0.113.50", 3333), ("203.0.113.77", 4444))  # TEST-NET-3 addresses


def model_distinct_actions_under_dedup() -> Scenario:
    """mallory's job reads llama-70b's config.json first (and again), then three weight
    shards with three other tools; two nc processes talk to two mining pools."""
    job = MALLORY_JOB.id
    loader = Proc(61300, "mallory", ["/usr/bin/python3", "peek.py", LLAMA70], job=job)
    tools = [
        Proc(61301, "mallory", ["/usr/bin/cp", "-r", LLAMA70, "/tmp/.m"], job=job),
        Proc(61302, "mallory", ["/usr/bin/dd", f"if={LLAMA70}/x", "of=/dev/null"], job=job),
        Proc(61303, "mallory", ["/usr/bin/rsync", "-a", LLAMA70, "/tmp/.m"], job=job),
    ]
    ncs = [
        Proc(61304 + i, "mallory", ["/usr/bin/nc", ip, str(port)], job=job)
        for i, (ip, port) in enumerate(POOLS)
    ]
    config = FileAccess(61300, f"{LLAMA70}/config.json", ["open", "read"], count=3)
    weights = shards(LLAMA70, 30, 1, 3)
    copies = [
        FileAccess(tool.pid, path, ["open", "read"], count=1200, size=4_983_000_000)
        for tool, path in zip(tools, weights, strict=True)
    ]
    links = [
        Sock(nc.pid, ("10.30.0.17", 51000 + i), pool)
        for i, (nc, pool) in enumerate(zip(ncs, POOLS, strict=True))
    ]
    t = times(4)
    common = {"jobs": [MALLORY_JOB], "procs": [loader, *tools, *ncs]}
    samples = [
        node_sample(t[0], **common, files=[config]),
        node_sample(t[1], **common, files=[config, *copies]),  # config.json again: a repeat
        node_sample(t[2], **common, sockets=links),
        node_sample(t[3], **common, sockets=links),  # the same connections: repeats
    ]
    return scenario(
        "model_theft-distinct-actions-under-dedup",
        "mallory's job 4250 reads llama-70b's config.json first, then copies three shards "
        "with cp, dd and rsync, and runs two nc to two mining pools: every shard and every "
        "pool is named by an alert of its own, repeats only grow a count",
        samples,
        [
            alert(
                "4c174e27-ed1a-4006-900a-52f92b9e8ebf",
                "Model weights read by an account not allowed for that model",
                job="4250",
                user="mallory",
                distinct={"file.path": [f"{LLAMA70}/config.json", *weights]},
            ),
            alert(
                "f59bcccf-92ba-48c8-9f3e-1eb9599acd73",
                "Connection to a mining pool port",
                job="4250",
                user="mallory",
                distinct={"destination.ip": [ip for ip, _ in POOLS]},
            ),
        ],
    )


DEDUP_ATTACKS = (model_distinct_actions_under_dedup,)
