"""`hpcsec config` (being written)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="(being written)")
    p.set_defaults(func=lambda args: print("hpcsec config: not available yet") or 2)
