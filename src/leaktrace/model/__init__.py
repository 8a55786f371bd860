"""Plain data that flows from sources to outputs: snapshots, groups, counters, reports."""
