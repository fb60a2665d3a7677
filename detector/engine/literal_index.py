"""The literal index at run time: the candidate rules of an event, found from the keys of its
rules (index.py says which keys a rule has and why a rule without them cannot match).

Per event, each indexed field is read once: its value (each element of a list; numbers and
booleans by their JSON spelling, as the string tests read them) is case-folded, looked up in one
hash table of all the rules' `eq` literals for that field, and scanned once by one Aho-Corasick
automaton holding all their `contains`/`startswith`/`endswith` literals (pyahocorasick, C);
the patterns of its `re` keys are searched in the value as it is, all in one RE2 pass.
A field keywords search is probed once, with its own literals and the keywords' together. What
a short text showed is remembered per field (MEMO_MAX; all fields together MEMO_TOTAL_MAX):
telemetry repeats its values.

One pass per field, not one over all of an event's new texts joined (field-tagged regions,
one automaton of every field's literals): pyahocorasick's cost is per character, which joining
does not lower, and the joined automaton, wider at its root and meeting every field's literals
in every text, cost more per event than the passes it replaced; so did an RE2 set over the
joined text (its many-match DFA). A text's own pass is cheaper than either.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import ahocorasick

from hpcsec.detector.engine import matchers as m
from hpcsec.detector.engine.regex import PatternSet

# (field, eq|contains|startswith|endswith, case-folded literal) or (field, re, pattern)
Key = tuple[str, str, str]
AFFIXES = ("contains", "startswith", "endswith")
# The field of a keyword's keys: any field keywords search. No rule field has a control
# character (rule files with one are refused), so no field of an event is named this.
ANY_FIELD = "\x00keywords"


def probe_texts(value: Any) -> Sequence[str]:
    """The case-folded texts the string tests of compile.py compare for this event value."""
    if value.__class__ is str:
        return (value.lower(),)
    values = value if value.__class__ is list else (value,)
    texts = []
    for each in values:
        text = m.as_text(each) if each is not None else None
        if text is not None:
            texts.append(text.lower())
    return texts


# What a field's texts showed is remembered for texts up to MEMO_TEXT_MAX characters, at most
# MEMO_MAX of them (then forgotten all at once): node telemetry repeats its values (names,
# paths, users), and a text met again costs one lookup. Hostile texts can only make it forget.
# All fields' memos of the process together hold at most MEMO_TOTAL_MAX texts (then all are
# forgotten at once): a flood of distinct texts over SigmaHQ's ~170 indexed fields would
# otherwise hold 170 x 1024 of them (~40 MB); at most ~250 bytes a text, this bounds it to ~8 MB.
MEMO_MAX = 1024
MEMO_TEXT_MAX = 128
MEMO_TOTAL_MAX = 32768
# Remembering costs too: a memo rarely asked again is paid for at every text it stores (a
# third of the index's time under a flood of new values: `bench sigmahq`, unique values). So
# each memo is judged when it is forgotten, the first time once it holds MEMO_JUDGED_MIN
# texts: one that answered fewer than one in MEMO_WORTH of the texts it held remembers only
# every MEMO_STRIDE-th text after, and is judged again at MEMO_JUDGED_MIN. A text repeated
# often is still met in memory; once MEMO_SAMPLE_MIN of the sample are asked again as often
# as that, or at the next judgment, the field remembers every text again (up to MEMO_MAX). A
# node can only make the index remember less: at worst every text is probed anew, which a
# flood of new values costs anyway.
MEMO_JUDGED_MIN = 256
MEMO_WORTH = 4
MEMO_STRIDE = 8
MEMO_SAMPLE_MIN = 32  # a sample asked again as often as that remembers every text at once
NO_RULES: frozenset[int] = frozenset()
# Up to this many substring literals, a field tests each with `in`; more go into one
# Aho-Corasick automaton, whose scan costs about a microsecond however few it holds.
FEW_LITERALS = 4


def raw_texts(value: Any) -> Sequence[str]:
    """The texts, as they are, a regex test (matchers.regex) searches in this event value."""
    if value.__class__ is str:
        return (value,)
    values = value if value.__class__ is list else (value,)
    return [text for text in map(m.as_text, values) if text is not None]


class MemoBudget:
    """The texts all FieldIndex memos of the process hold together (MEMO_TOTAL_MAX): every
    engine's, so rebuilding one on a rule reload cannot multiply it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        # the fields whose memo holds texts: weakly, so a discarded engine is freed
        self.holders: weakref.WeakSet[FieldIndex] = weakref.WeakSet()

    def take(self, field: FieldIndex) -> None:
        """Room for one more text in the memo of `field`: all memos are forgotten when full
        (once every `limit` texts, so O(1) a text amortised)."""
        if self.used >= self.limit:
            for holder in list(self.holders):
                holder.forget()
            self.holders.clear()
            self.used = 0
        if not field.memo:
            self.holders.add(field)
        self.used += 1

    def forget(self, field: FieldIndex) -> None:
        """Forget the texts of one field's memo."""
        self.used -= len(field.memo)
        field.forget()


MEMOS = MemoBudget(MEMO_TOTAL_MAX)


class FieldIndex:
    """The literals of one field: exact values in a dict, the rest in one automaton (a tuple
    when they are few); and the patterns of its `re` keys in one regex.PatternSet."""

    __slots__ = (
        "__weakref__",
        "automaton",
        "exact",
        "few",
        "field",
        "hits",
        "memo",
        "pattern_rules",
        "patterns",
        "room",
        "skip",
        "stride",
    )

    def __init__(self, field: str, keys: dict[tuple[str, str], set[int]]):
        self.field = field
        self.exact: dict[str, frozenset[int]] = {}
        affixes: dict[str, tuple[set[int], set[int], set[int]]] = {}
        patterns: dict[str, frozenset[int]] = {}
        for (kind, literal), rules in keys.items():
            if kind == "eq":
                self.exact[literal] = frozenset(rules)
            elif kind == "re":
                patterns[literal] = frozenset(rules)
            else:
                affixes.setdefault(literal, (set(), set(), set()))[AFFIXES.index(kind)].update(
                    rules
                )
        self.automaton: Any = None
        self.few: tuple[tuple[str, frozenset[int], frozenset[int], frozenset[int]], ...] = ()
        if 0 < len(affixes) <= FEW_LITERALS:
            self.few = tuple(
                (literal, frozenset(inside), frozenset(starts), frozenset(ends))
                for literal, (inside, starts, ends) in affixes.items()
            )
        elif affixes:
            self.automaton = automaton_of(affixes)
        self.patterns = PatternSet(list(patterns)) if patterns else None
        self.pattern_rules = tuple(patterns.values())
        self.memo: dict[str, frozenset[int]] = {}
        self.hits = 0  # texts the memo answered since it was last forgotten
        self.stride = 1  # remember one text in `stride` (MEMO_STRIDE when it paid little)
        self.skip = 1  # texts to go until the next one remembered
        self.room = MEMO_JUDGED_MIN  # texts it holds before it is forgotten (and judged)

    def probe_text(self, text: str, found: set[int]) -> None:
        """Add the rules whose keys a text shows (its literals case-folded, its patterns as
        it is); remembered when the text is short, for the next event that shows it."""
        own: set[int] = set()
        self.collect(text.lower(), own)
        if self.patterns is not None:
            self.collect_patterns(text, own)
        if own:
            found |= own
        if len(text) <= MEMO_TEXT_MAX:
            self.skip -= 1
            if self.skip:
                return
            self.skip = self.stride
            if len(self.memo) >= self.room:  # forget all at once: O(1) a text, whatever comes
                MEMOS.forget(self)
            elif self.stride > 1 and self.hits * MEMO_WORTH >= len(self.memo) >= MEMO_SAMPLE_MIN:
                self.stride = self.skip = 1  # its sample is asked again: its values repeat
                self.room = MEMO_MAX
            MEMOS.take(self)
            self.memo[text] = frozenset(own) if own else NO_RULES

    def forget(self) -> None:
        """Forget what the memo holds (MemoBudget says when), judging first what it was
        worth: one rarely asked again remembers one text in MEMO_STRIDE from now on, until
        it is worth more."""
        stored = len(self.memo)
        if stored >= MEMO_JUDGED_MIN:
            paid = self.hits * MEMO_WORTH >= stored
            self.stride = 1 if paid else MEMO_STRIDE
            self.room = MEMO_MAX if paid else MEMO_JUDGED_MIN
            self.skip = min(self.skip, self.stride)
        self.hits = 0
        self.memo.clear()

    def collect_patterns(self, text: str, found: set[int]) -> None:
        """The rules of the patterns found in the text as it is (not case-folded)."""
        assert self.patterns is not None
        for position in self.patterns.found(text):
            found |= self.pattern_rules[position]

    def collect(self, text: str, found: set[int]) -> None:
        rules = self.exact.get(text)
        if rules:
            found |= rules
        for literal, inside, starts, ends in self.few:
            if literal in text:
                if inside:
                    found |= inside
                if starts and text.startswith(literal):
                    found |= starts
                if ends and text.endswith(literal):
                    found |= ends
        if self.automaton is None:
            return
        last = len(text) - 1
        for end, (length, inside, starts, ends, longer) in self.automaton.iter(text):
            if inside:
                found |= inside
            if starts and end == length - 1:
                found |= starts
            if ends and end == last:
                found |= ends
            if longer:
                collect_longer(text, end - PREFIX_MAX + 1, longer, found)


# A literal longer than this goes into the automaton as its first PREFIX_MAX characters, and
# is checked whole where they are found: the automaton's memory grows with every character of
# its literals, and rule sets hold thousands of long ones (5,700 hashes and driver names in
# ten SigmaHQ driver-load rules). Every place the literal occurs, its prefix occurs too, so the
# check sees each of them. SigmaHQ's rules: 149 MB whole, 143 MB so (`bench sigmahq`); a
# shorter prefix saved more but was found, and checked in vain, in more benign texts.
PREFIX_MAX = 24
# ... unless more literals than this start the same: each would then be checked wherever that
# common start is found, so they go in whole.
PREFIX_SHARED_MAX = 2
Affix = tuple[str, frozenset[int], frozenset[int], frozenset[int]]  # literal, in, starts, ends
NO_AFFIX: frozenset[int] = frozenset()


def automaton_of(affixes: dict[str, tuple[set[int], set[int], set[int]]]) -> Any:
    """One automaton of a field's contains/startswith/endswith literals. A word's value is
    (its length, the rules of the literal that is the word itself, for each kind, or none,
    and the longer literals the word is the prefix of)."""
    own: dict[str, Affix] = {}
    longer: dict[str, list[Affix]] = {}
    for literal, (inside, starts, ends) in affixes.items():
        affix = (literal, frozenset(inside), frozenset(starts), frozenset(ends))
        if len(literal) > PREFIX_MAX:
            longer.setdefault(literal[:PREFIX_MAX], []).append(affix)
        else:
            own[literal] = affix
    for prefix, group in list(longer.items()):
        if len(group) > PREFIX_SHARED_MAX:  # a common start (`c:\windows\system3`): whole
            del longer[prefix]
            own.update((affix[0], affix) for affix in group)
    automaton = ahocorasick.Automaton()
    for word in own.keys() | longer.keys():
        _, within, at_start, at_end = own.get(word, (word, NO_AFFIX, NO_AFFIX, NO_AFFIX))
        value = (len(word), within, at_start, at_end, tuple(longer.get(word, ())))
        automaton.add_word(word, value)
    automaton.make_automaton()
    return automaton


def collect_longer(text: str, start: int, longer: tuple[Affix, ...], found: set[int]) -> None:
    """The rules of the longer literals whose prefix was found at `start` of the text, where
    the whole literal is there."""
    for literal, inside, starts, ends in longer:
        if text.startswith(literal, start):
            if inside:
                found |= inside
            if starts and start == 0:
                found |= starts
            if ends and start + len(literal) == len(text):
                found |= ends


# The fields whose lookup a LiteralIndex remembers (node field names are hostile: past this
# many, a name is looked up anew each time rather than remembered).
KNOWN_NAMES_MAX = 4096
_UNKNOWN = object()


class LiteralIndex:
    """Candidate rules (their positions in the category) of an event."""

    def __init__(self, rules: Sequence[frozenset[Key]]):
        by_field: dict[str, dict[tuple[str, str], set[int]]] = {}
        for position, keys in enumerate(rules):
            for field, kind, literal in keys:
                by_field.setdefault(field, {}).setdefault((kind, literal), set()).add(position)
        keywords = by_field.pop(ANY_FIELD, None)
        self.keywords = FieldIndex(ANY_FIELD, keywords) if keywords else None
        # A field keywords search is probed once, with its own literals and the keywords'
        # (merged); one they do not search (in some category: matchers.searched_by_keywords),
        # with its own (fields). Keywords search in a `slurm_job` event whatever they search
        # in another.
        self.fields = {
            f: FieldIndex(f, keys)
            for f, keys in by_field.items()
            if keywords is None or not m.searched_by_keywords(f, None)
        }
        self._merged = {
            f: FieldIndex(f, merged_keys(keys, keywords))
            for f, keys in by_field.items()
            if keywords is not None and m.searched_by_keywords(f, "slurm_job")
        }
        # name -> the FieldIndex its values are probed with (None: not probed), per whether
        # the event is a `slurm_job` one (keywords search its `slurm.*` fields)
        self._known: tuple[dict[str, FieldIndex | None], dict[str, FieldIndex | None]] = ({}, {})

    def probe_of(self, name: str, category: Any) -> FieldIndex | None:
        """What the values of the field `name` are probed with in an event of `category`:
        the field's literals, and the keywords' when keywords search it (matchers.keyword)."""
        if self.keywords is not None and m.searched_by_keywords(name, category):
            return self._merged.get(name, self.keywords)
        return self.fields.get(name)

    def candidates(self, event: dict[str, Any]) -> set[int]:
        """One pass over the event's fields (fewer than the index's, as a rule): each value is
        folded once and probed once, with what probe_of says (remembered per field name)."""
        found: set[int] = set()
        if self.keywords is None:
            category = None
            known = self._known[0]
        else:
            category = event.get("event.category")
            known = self._known[category == "slurm_job"]
        lookup = known.get
        index: Any
        for name, value in event.items():
            index = lookup(name, _UNKNOWN)
            if index is _UNKNOWN:
                index = self.probe_of(name, category)
                if len(known) < KNOWN_NAMES_MAX:
                    known[name] = index
            if index is None or value is None:
                continue
            if value.__class__ is str:
                rules = index.memo.get(value)
                if rules is None:
                    index.probe_text(value, found)
                else:
                    index.hits += 1
                    if rules:
                        found |= rules
            elif value.__class__ is not dict:  # keywords skip objects; no string test reads one
                for text in probe_texts(value):
                    index.collect(text, found)
                if index.patterns is not None:
                    for text in raw_texts(value):
                        index.collect_patterns(text, found)
        return found


def merged_keys(
    own: dict[tuple[str, str], set[int]], other: dict[tuple[str, str], set[int]]
) -> dict[tuple[str, str], set[int]]:
    merged = {key: set(rules) for key, rules in own.items()}
    for key, rules in other.items():
        merged.setdefault(key, set()).update(rules)
    return merged
