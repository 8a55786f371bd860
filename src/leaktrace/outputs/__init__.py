"""Renderers: pure functions of a symbolized snapshot (text, JSON, pprof, folded, HTML, top view)."""
