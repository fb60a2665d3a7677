"""Where the Prolog=/Epilog= hooks keep their state and events, and the agent finds them.

Apart from jobs.py (the agent's job table, Slurm commands, process attribution) so that the
prolog, which runs before every job, knows these names without importing any of that.
"""

from __future__ import annotations

import os

DEFAULT_HOOK_STATE_DIR = "/var/lib/hpcsec"
HOOK_EVENTS_FILE = "slurm-events.jsonl"  # appended by the prolog/epilog, tailed by slurm_jobs


def default_hook_state_dir() -> str:
    """Where `hpcsec slurm prolog|epilog` write when not given --state-dir."""
    return os.environ.get("HPCSEC_STATE_DIR") or DEFAULT_HOOK_STATE_DIR
