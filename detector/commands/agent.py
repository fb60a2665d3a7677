"""`hpcsec agent` (being written)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="(being written)")
    p.set_defaults(func=lambda args: print("hpcsec agent: not available yet") or 2)
