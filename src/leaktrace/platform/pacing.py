"""How often a loop polls a trace: often while polls are quick, less when they are not."""

from __future__ import annotations

POLL_TICK = 0.02  # seconds between polls, when a poll is quick


def poll_pause(poll_seconds: float) -> float:
    """How long to wait after a poll that took poll_seconds: POLL_TICK, or nine times as long
    when the poll was slow (a systemwide trace under process churn), so that polling takes at
    most a tenth of a CPU."""
    return max(POLL_TICK, 9 * poll_seconds)
