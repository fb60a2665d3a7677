"""What the literal index remembers of the texts it has probed stays bounded for the whole
process (MEMO_TOTAL_MAX), whatever a node floods it with; a memo rarely asked again remembers
only a sample of its texts until its values repeat again; and neither forgetting nor sampling
ever changes the candidates an event gets."""

from __future__ import annotations

import gc

import pytest

from hpcsec.detector.engine import literal_index
from hpcsec.detector.engine.literal_index import (
    MEMO_JUDGED_MIN,
    MEMO_MAX,
    MEMO_SAMPLE_MIN,
    MEMO_STRIDE,
    MEMO_TEXT_MAX,
    MEMO_TOTAL_MAX,
    LiteralIndex,
    MemoBudget,
)

FIELDS = 2 * MEMO_TOTAL_MAX // MEMO_MAX  # enough fields to hold twice the budget


@pytest.fixture(autouse=True)
def fresh_budget(monkeypatch: pytest.MonkeyPatch) -> MemoBudget:
    """The budget is the process's: other tests' memos must not count in these."""
    budget = MemoBudget(MEMO_TOTAL_MAX)
    monkeypatch.setattr(literal_index, "MEMOS", budget)
    return budget


def many_fields_index(fields: int) -> LiteralIndex:
    return LiteralIndex([frozenset({(f"f{n}", "contains", "evil")}) for n in range(fields)])


def remembered(index: LiteralIndex) -> int:
    return sum(len(field.memo) for field in index.fields.values())


def test_a_flood_over_many_fields_keeps_the_total_under_the_budget():
    index = many_fields_index(FIELDS)
    for n in range(MEMO_MAX):
        event = {f"f{f}": f"{n}-{f}-".ljust(MEMO_TEXT_MAX, "x") for f in range(FIELDS)}
        assert index.candidates(event) == set()
        assert remembered(index) <= MEMO_TOTAL_MAX
    # each field alone stayed under its own bound: only the shared budget caps the sum
    assert remembered(index) > 0


def test_the_budget_is_shared_by_every_index_of_the_process():
    indexes = [many_fields_index(FIELDS // 4) for _ in range(4)]
    for n in range(MEMO_MAX):
        for index in indexes:
            index.candidates({f"f{f}": f"t{n}" for f in range(FIELDS // 4)})
    assert sum(map(remembered, indexes)) <= MEMO_TOTAL_MAX


def test_forgetting_never_changes_the_candidates():
    index = many_fields_index(FIELDS)
    hostile = 0
    for _round in range(3):
        for f in range(FIELDS):
            for _ in range(MEMO_MAX // 2):
                hostile += 1
                assert index.candidates({f"f{f}": f"x{hostile}"}) == set()
            # a text met before, whether or not it is still remembered
            assert index.candidates({f"f{f}": "EVIL"}) == {f}
            assert index.candidates({f"f{f}": "evil", "f0": "an evil one"}) == {0, f}


def test_a_flood_on_one_field_leaves_the_others_remembered():
    index = many_fields_index(2)
    index.candidates({"f0": "bash"})
    for n in range(10 * MEMO_MAX):
        index.candidates({"f1": f"x{n}"})
    assert "bash" in index.fields["f0"].memo
    assert len(index.fields["f1"].memo) <= MEMO_MAX


def test_a_discarded_index_is_freed_with_its_memo(fresh_budget: MemoBudget):
    index = many_fields_index(2)
    index.candidates({"f0": "bash", "f1": "sh"})
    assert len(fresh_budget.holders) == 2
    del index
    gc.collect()
    assert len(fresh_budget.holders) == 0


def test_a_memo_rarely_asked_again_remembers_only_one_text_in_a_stride():
    index = many_fields_index(1)
    field = index.fields["f0"]
    for n in range(MEMO_JUDGED_MIN):  # a first memo's worth of new texts: all remembered
        index.candidates({"f0": f"new {n}"})
    assert len(field.memo) == MEMO_JUDGED_MIN
    flood = MEMO_STRIDE * 100
    for n in range(flood):
        index.candidates({"f0": f"newer {n}"})
    # judged at the next text: asked again for none of them, it now keeps one in a stride
    assert field.stride == MEMO_STRIDE
    assert len(field.memo) <= flood // MEMO_STRIDE + 1
    assert sum(f"newer {n}" in field.memo for n in range(flood)) == len(field.memo)


def test_values_that_repeat_again_are_all_remembered_again():
    index = many_fields_index(1)
    field = index.fields["f0"]
    for n in range(MEMO_STRIDE * MEMO_JUDGED_MIN):
        index.candidates({"f0": f"flood {n}"})
    assert field.stride == MEMO_STRIDE
    users = [f"user{n}" for n in range(2 * MEMO_JUDGED_MIN)]  # more than a sampled memo holds
    for _round in range(2 * MEMO_STRIDE):
        for user in users:
            index.candidates({"f0": user})
    assert field.stride == 1
    before = field.hits
    for user in users:
        index.candidates({"f0": user})
    assert field.hits == before + len(users)  # every one answered from memory


def test_a_field_whose_values_repeat_is_never_sampled():
    index = many_fields_index(1)
    field = index.fields["f0"]
    for n in range(4 * MEMO_MAX):
        index.candidates({"f0": f"host{n % 100}"})
        index.candidates({"f0": f"job {n}"})  # half new: still asked again as often
    assert field.stride == 1


def test_sampling_never_changes_the_candidates():
    index = many_fields_index(2)
    for n in range(MEMO_STRIDE * MEMO_JUDGED_MIN * 2):
        assert index.candidates({"f0": f"x{n}"}) == set()
        if n % 7 == 0:
            assert index.candidates({"f0": f"x{n} EVIL"}) == {0}
            assert index.candidates({"f0": "evil", "f1": f"an evil {n}"}) == {0, 1}
            assert index.candidates({"f0": f"x{n}"}) == set()
    assert index.fields["f0"].stride == MEMO_STRIDE


def test_a_sample_asked_again_makes_the_field_remember_every_text_at_once():
    index = many_fields_index(1)
    field = index.fields["f0"]
    for n in range(MEMO_JUDGED_MIN + 1):  # judged at the last: the memo starts anew, sampled
        index.candidates({"f0": f"flood {n}"})
    assert field.stride == MEMO_STRIDE
    assert len(field.memo) == 1
    hosts = [f"node{n:03}" for n in range(MEMO_SAMPLE_MIN + 8)]  # too few to fill the memo
    for _round in range(4 * MEMO_STRIDE):
        for host in hosts:
            index.candidates({"f0": host})
    assert field.stride == 1
    index.candidates({"f0": "a new one"})
    assert "a new one" in field.memo
