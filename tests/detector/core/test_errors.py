"""SourceLocation is written by hand (start-up: no `dataclasses` import) and must behave as the
frozen dataclass it replaces: the same equality, hash, repr, immutability, pickling."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import pytest

from hpcsec.detector.core.errors import RuleError, SourceLocation, location


@dataclass(frozen=True)
class AsDataclass:  # what SourceLocation was
    path: str | None = None
    line: int | None = None
    column: int | None = None


CASES = [(), ("r.yml",), ("r.yml", 3), ("r.yml", 3, 7), (None, 2), ("a\x1bb", None, 1)]


@pytest.mark.parametrize("args", CASES)
def test_repr_equality_and_hash_are_the_dataclass_ones(args) -> None:
    ours, theirs = SourceLocation(*args), AsDataclass(*args)
    assert repr(ours) == repr(theirs).replace("AsDataclass", "SourceLocation")
    assert ours == SourceLocation(*args) and hash(ours) == hash(SourceLocation(*args))
    assert hash(ours) == hash(theirs)  # both hash the tuple of the fields
    assert {ours: 1}[SourceLocation(*args)] == 1


def test_keywords_defaults_and_inequality() -> None:
    assert SourceLocation(path="p", column=2) == SourceLocation("p", None, 2)
    assert SourceLocation("p", 1) != SourceLocation("p", 2)
    assert SourceLocation("p", 1) != ("p", 1, None)
    assert SourceLocation() != AsDataclass()  # another class, as between two dataclasses


def test_it_is_immutable() -> None:
    where = SourceLocation("p", 1)
    for name in ("path", "line", "column", "other"):
        with pytest.raises(AttributeError):
            setattr(where, name, 5)
        with pytest.raises(AttributeError):
            delattr(where, name)
    assert where == SourceLocation("p", 1)


def test_pickle_and_copy_keep_it() -> None:
    error = RuleError("bad", location("r.yml", 4, 2))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        where = pickle.loads(pickle.dumps(error.location, protocol=protocol))
        assert where == SourceLocation("r.yml", 4, 2)
    assert copy.copy(error.location) == copy.deepcopy(error.location) == error.location
    assert str(error) == "r.yml:4:2: bad"
    assert str(SourceLocation()) == "<input>" and str(SourceLocation(None, 3)) == "<input>:3"
