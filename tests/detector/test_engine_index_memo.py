"""What the literal index remembers of the texts it has probed stays bounded for the whole
process (MEMO_TOTAL_MAX), whatever a node floods it with, and forgetting never changes the
candidates an event gets."""

from __future__ import annotations

import gc

import pytest

from hpcsec.detector.engine import literal_index
from hpcsec.detector.engine.literal_index import (
    MEMO_MAX,
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
