"""The closest known name to a mistyped one ("did you mean ...?"), for every error that lists
allowed names: plan keys (:func:`xsim_adapters.plan._fields.check_keys`) and backend options
(:mod:`xsim_adapters.options`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's similarity ratio a suggestion must reach (its default: `micro_bach` -> `micro_batch`
# 0.95, `shedule` -> `schedule` 0.93, `tp` -> `tp_comm` 0.44 is not suggested).
MIN_SIMILARITY = 0.6
# Longer words are not compared (difflib is quadratic in the lengths; a hostile 100,000-character
# key must not take seconds to reject).
MAX_COMPARED_CHARS = 200


def closest(word: object, choices: Iterable[object]) -> str | None:
    """The choice most similar to ``word`` (as strings), or None when none is close."""
    text = str(word) if isinstance(word, str | int | float) else None
    if text is None or not text or len(text) > MAX_COMPARED_CHARS:
        return None
    close = difflib.get_close_matches(text, [str(c) for c in choices], n=1,
                                      cutoff=MIN_SIMILARITY)
    return close[0] if close else None
