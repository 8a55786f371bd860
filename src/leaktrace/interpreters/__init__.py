"""Interpreters whose frames leaktrace shows among native ones: one folder a language, each
with its version table, the readers of its objects and both engines' walks of its frames."""
