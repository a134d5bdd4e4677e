"""Validation suite: published measurements reproduced from their configurations alone.

Run ``python -m validation`` (``--help`` for options). Each source is a module of this package
with a ``SOURCE`` name and a ``cases()`` function returning :class:`validation.framework.Case`
objects; :mod:`validation.framework` finds them, runs them, and writes the CSV, the scatter plot
and the Markdown table (docs/validation.md).
"""
