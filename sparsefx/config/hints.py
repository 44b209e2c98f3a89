"""Hints for a pattern that matches no parameter: the parameter names most like it.

>>> closest_names("fc3.weight", ["fc1.weight", "fc2.weight", "head.bias"])
"closest parameter names: 'fc1.weight', 'fc2.weight'"
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

__all__ = ["closest_names"]


def closest_names(pattern: str, names: list[str], aliases: Mapping[str, str] | None = None) -> str:
    """A hint naming the parameters most like ``pattern``, for a pattern that matches none.

    Names are ranked by the word tokens of the pattern they contain (``weight`` and ``bias`` count
    last): whole tokens of the dotted or underscored name first, then substrings, rarer tokens
    first, then by difflib similarity. With
    no token in common, difflib alone ranks them. ``aliases`` (``{other name: listed name}``) of tied
    parameters are candidates too, and shown as ``'<listed>' (tied with '<other>')``.

    >>> closest_names("ffn.*weight", ["ln_f.weight", "blocks.0.ffn.fc.weight", "blocks.0.ffn.fc.bias"])
    "closest parameter names: 'blocks.0.ffn.fc.weight', 'blocks.0.ffn.fc.bias', 'ln_f.weight'"
    >>> closest_names("lm_head", ["wte.weight", "ln_f.weight"], {"lm_head.weight": "wte.weight"})
    "closest parameter names: 'wte.weight' (tied with 'lm_head.weight')"
    """
    if not names:
        return "the model has no parameters"
    aliases = dict(aliases or {})
    candidates = [*names, *aliases]
    tokens = _pattern_tokens(pattern)
    counts = {token: sum(token in name.lower() for name in candidates) for token in tokens}
    scored = [(_token_score(name, tokens, counts), name) for name in candidates]
    ranked = [name for score, name in sorted(scored, key=lambda item: item[0], reverse=True) if score[1]]
    limit = 3
    if not ranked:
        ranked = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.3)
    if not ranked:
        ranked, limit = names[:5], 5
    shown: dict[str, str | None] = {}  # listed name -> its other name, when tied
    for name in ranked:
        listed = aliases.get(name, name)
        if listed in shown:
            continue
        shown[listed] = name if name != listed else _alias_of(listed, aliases)
        if len(shown) == limit:
            break
    return "closest parameter names: " + ", ".join(
        repr(name) + (f" (tied with {alias!r})" if alias else "") for name, alias in shown.items()
    )


_PARAM_KINDS = frozenset({"weight", "bias"})


def _pattern_tokens(pattern: str) -> tuple[str, ...]:
    """The word tokens of a regex or glob, escapes and character classes left out.

    >>> _pattern_tokens(r"blocks\\.\\d+\\.ffn.*weight")
    ('blocks', 'ffn', 'weight')
    """
    text = re.sub(r"\\[A-Za-z]|\[[^\]]*\]|\{[^}]*\}", " ", pattern.lower())
    return tuple(dict.fromkeys(token for token in re.split(r"[^a-z0-9]+", text) if token))


def _token_score(name: str, tokens: tuple[str, ...], counts: Mapping[str, int]) -> tuple[float, ...]:
    """(tokens matched other than weight/bias, tokens matched, whole tokens, rarity of those matched,
    difflib similarity), to sort descending: ``weight`` says little about which module was meant."""
    lowered = name.lower()
    words = set(re.split(r"[^a-z0-9]+", lowered))
    whole = [token for token in tokens if token in words]
    partial = [token for token in tokens if token not in words and token in lowered]
    matched = (*whole, *partial)
    telling = sum(token not in _PARAM_KINDS for token in matched)
    rarity = sum(1.0 / counts[token] for token in matched)
    similarity = difflib.SequenceMatcher(None, " ".join(tokens), lowered).ratio()
    return (telling, len(matched), len(whole), rarity, similarity)


def _alias_of(name: str, aliases: Mapping[str, str]) -> str | None:
    """The first other name of a tied parameter listed as ``name``, if it has one."""
    return next((alias for alias, listed in aliases.items() if listed == name), None)
