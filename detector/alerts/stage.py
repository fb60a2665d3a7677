"""The alert stage every command runs: matches -> deduplicated alerts -> silences and rate
limits -> a Decision (what to send, what only to store, and why).

A scan folds every batch first and decides once, over all its alerts sorted by severity, at
the end (`conclude`): a summary of what the rate limit held back goes out with the rest. The
agent decides as alerts appear (`decide`), closes rate-limit minutes as they end
(`due_summaries`) and forgets ended dedup windows (`rotate`). Both go through the same dedup
and the same suppressor, so an alert is folded, silenced and limited the same way whichever
command saw it. The pipeline folds (`fold`); its driver decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from hpcsec.detector.alerts.dedup import WindowedDedup
from hpcsec.detector.alerts.model import Alert, sort_alerts
from hpcsec.detector.alerts.suppression import Decision, Suppressor
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.engine.evaluate import Match


class AlertStage:
    def __init__(
        self,
        config: SiteConfig,
        *,
        dedup: bool = True,
        clock: Callable[[], float] = time.time,
        suppressor: Suppressor | None = None,
    ):
        self.dedup_enabled = dedup
        self._clock = clock
        self.dedup = WindowedDedup(config.dedup_window_s, clock, dedup=dedup)
        self.suppressor = suppressor or Suppressor.from_config(config)

    # -- folding -----------------------------------------------------------------------------

    def fold(self, matches: list[Match]) -> list[Alert]:
        """Dedup only: returns the alerts that are new."""
        return self.dedup.add(matches)

    def current(self) -> list[Alert]:
        """The current value of every open alert (counts grown by dedup included)."""
        return self.dedup.alerts()

    def grown(self) -> list[Alert]:
        """Current values of the open alerts that repeats were folded into since the last
        call: the agent stores them on its housekeeping tick, so the store's counts keep up
        with the outputs instead of waiting for the window's end or shutdown."""
        return self.dedup.take_grown()

    def rotate(self) -> list[Alert]:
        """Forget a dedup window that ended; returns its alerts' final values."""
        return self.dedup.rotate()

    # -- deciding ----------------------------------------------------------------------------

    def decide(self, alerts: list[Alert]) -> Decision:
        """Silences and rate limits for these alerts now: the new alerts of a step (the
        agent), or hpcsec's own alerts."""
        return self.suppressor.apply(alerts)

    def due_summaries(self) -> Decision:
        """Summaries of rate-limit minutes that have ended, nothing else."""
        return self.suppressor.apply([])

    def finish(self) -> list[Alert]:
        """Summaries of every rate-limit minute with held-back alerts, ended or not."""
        return self.suppressor.finish()

    def conclude(self) -> Decision:
        """Decide once over every alert, most severe first, summaries included (the scan)."""
        decision = self.suppressor.apply(sort_alerts(self.current()))
        return replace(decision, send=decision.send + self.finish())

    # -- reload ------------------------------------------------------------------------------

    def reconfigure(self, config: SiteConfig) -> list[Alert]:
        """New silences, rate limit and dedup window. A new window size starts dedup afresh;
        returns the alerts of the old state (their final values, for the store)."""
        self.suppressor.reconfigure(config)
        if max(int(config.dedup_window_s), 1) == self.dedup.window_s:
            return []
        final = self.dedup.alerts()
        self.dedup = WindowedDedup(config.dedup_window_s, self._clock, dedup=self.dedup_enabled)
        return final
