"""The engine's per-event loop: work skipped where it cannot change the result (correlations no
event has touched since their last expiry), with the same matches as the work it saves."""

from __future__ import annotations

from hpcsec.detector.engine.evaluate import Engine
from tests.detector.test_engine_correlation import correlation, gpu, ids, read, ruleset

# a closing window (decided at its end) on gpu_proc, a sliding one on file_read
FEW_GPU = correlation("event_count", "[gpu_proc]", "{lt: 3}", name="few_gpu")
MANY_READS = correlation("event_count", "[file_read]", "{gte: 100}", name="many_reads")


def two_correlations() -> Engine:
    return Engine(ruleset(FEW_GPU + "---\n" + MANY_READS))


def test_a_window_closes_on_the_time_of_events_that_feed_other_correlations():
    engine = two_correlations()
    assert engine.evaluate([gpu(0), read(10)]) == []
    # only reads from now on: gpu_proc's window (0 s + 5 min) closes as their time passes it
    assert engine.evaluate([read(200)]) == []
    assert ids(engine.evaluate([read(400)])) == ["few_gpu"]
    (few_gpu, many_reads) = engine.correlations
    assert not few_gpu.groups and len(many_reads.groups) == 1


def test_correlations_unchanged_since_their_last_expiry_are_not_walked_again(monkeypatch):
    engine = two_correlations()
    few_gpu, many_reads = engine.correlations
    calls = {"few_gpu": 0, "many_reads": 0}

    def counted(name, expire):
        def count(now):
            calls[name] += 1
            return expire(now)

        return count

    monkeypatch.setattr(few_gpu, "expire", counted("few_gpu", few_gpu.expire))
    monkeypatch.setattr(many_reads, "expire", counted("many_reads", many_reads.expire))
    engine.evaluate([gpu(0)])
    engine.evaluate([read(t, user=f"u{t}") for t in range(1, 101)])
    # expiry runs before an event is fed: an empty correlation is skipped; gpu_proc's group
    # is looked at once (its window ends at 300 s) and not again, no event having fed it since;
    # each read but the first finds many_reads fed by the one before
    assert calls == {"few_gpu": 1, "many_reads": 99}
    assert ids(engine.evaluate([read(301)])) == ["few_gpu"]
    assert calls == {"few_gpu": 2, "many_reads": 100}
