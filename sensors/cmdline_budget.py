"""A sample's command lines, bounded per owner.

Each command line is condensed to at most 64 KiB (cmdline_condense.py), but a user chooses
how many processes carry one: 300 sleeping processes with 64 KiB of bytes that are not
UTF-8 (each byte is four characters of event text, `\\xff`, in `process.command_line` and
again in `process.args`) made 300 MB of events in every sample of the agent, whose budget is
80 MB. So each owner (a uid, or the user a rootless container's subordinate uid belongs to:
procinfo.owner_key) has OWNER_BUDGET characters of command lines per sample kept as read;
the command lines of that owner's further processes in the sample are shortened to their
head (HEAD_KEEP) and an excerpt around each text of the loaded rules they show (the
condenser's Literals), with a marker saying how much was left out, and are marked
`process.command_line_truncated` as a condensed one is. A user's many processes thus cost
their own command lines, not the detection of another user's: another owner's budget is
untouched. Shortening is decided on the bytes, before they become text: spelling the
sleepers' bytes as `\\xNN` took the agent 77 % of a core, 10 % once only what is kept is
spelled. The rules' texts are still seen in every command line (a miner behind 300
padded sleepers keeps its `stratum+tcp://`); what is lost past the budget is the context
around them (regular expressions over the whole line).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from hpcsec.detector.core.text import from_node_bytes
from hpcsec.sensors.cmdline_condense import Literals, excerpt
from hpcsec.sensors.proclists import cut_to

OWNER_BUDGET = 1024 * 1024  # characters of command lines per owner and sample, kept whole
HEAD_KEEP = 1024  # of a shortened command line, its first characters
MAX_EXCERPTS = 64  # rules' texts kept per shortened command line, at most (first found)


class CommandLineBudget:
    """The command lines of one sample, charged to their owners (one per sensor run)."""

    def __init__(self, literals: Literals | None):
        self.literals = literals
        self.spent: dict[Hashable, int] = {}
        self.shortened = 0  # command lines shortened in this sample

    def args(self, owner: Hashable, raw: list[bytes]) -> tuple[list[str], bool]:
        """The arguments of a process's command line (`raw`, as the condenser kept them) as
        event text, charged to `owner`; shortened (True) when the owner's budget for the
        sample is spent. Decided before the text is made: spelling each byte that is not
        UTF-8 as `\\xNN` costs more than the rest, and is not spent on what is left out."""
        spent = self.spent.get(owner, 0)
        size = sum(map(len, raw)) + len(raw)  # no text is shorter than its bytes
        short = spent + size > OWNER_BUDGET and shortened(raw, self.literals)
        args = short or [from_node_bytes(arg) for arg in raw]
        self.spent[owner] = spent + sum(map(len, args)) + len(args)
        self.shortened += bool(short)
        return args, bool(short)


def shortened(raw: list[bytes], literals: Literals | None) -> list[str] | None:
    """The arguments of a command line past its owner's budget, as event text: its first
    HEAD_KEEP bytes, an excerpt around each rule's text the rest shows, and a marker for
    what was left out (the condenser's GAP form, so that `is_condensed` sees it). None for
    one that short: it is kept as it is."""
    line = b" ".join(raw)
    if len(line) <= HEAD_KEEP:
        return None
    rest = line[HEAD_KEEP:]
    kept = [from_node_bytes(cut_to(line, len(line), HEAD_KEEP))]
    found = literals.found(rest) if literals is not None else {}
    spans = sorted(found.values())[:MAX_EXCERPTS]
    kept += [from_node_bytes(excerpt(rest, len(rest), start, end)) for start, end in spans]
    ends = itertools.accumulate(len(arg) + 1 for arg in raw)
    whole = sum(1 for end in ends if end - 1 <= HEAD_KEEP)  # arguments the head shows whole
    kept.append(f"\u2026[hpcsec: {len(raw) - whole} arguments ({len(rest)} bytes) left out]")
    return kept
