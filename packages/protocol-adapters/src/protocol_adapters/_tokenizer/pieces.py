r"""Where long text may be cut so that its pieces encode exactly as the whole text does.

Encoding a 20 MB request in one call costs gigabytes and cannot stop at a limit; encoding it in
pieces costs a piece at a time and stops once the limit is passed. A cut is sound only where the
tokenizer would end a token anyway, whatever follows: a BPE model never merges across a
pre-token boundary, so a boundary the pre-tokenizer always draws is such a place.

- Qwen's pre-tokenizer: the boundaries :data:`QWEN_CUTS` finds, proven from its regex.
- Any other regex pre-tokenizer (GPT-2's, Llama 3's, ...): the tokenizer's own pre-tokenizer
  finds the boundaries (:class:`PreTokenizerCuts`), on a window that starts at the previous cut,
  where its matching is in step with the whole text's (no pattern looks back), taking one that
  more pre-tokens follow inside the window (so the window's end did not decide it), after a
  character that is not whitespace (the one rule that looks ahead, ``\s+(?!\S)``, would end a
  run of spaces differently at a piece's end) and before an ASCII character (no normalizer
  composes across it), outside any added token. The pre-tokenizer sees the window as it is; the
  tokenizer sees it normalized: where they differ (text not in the normalizer's form already)
  the window gives no cut.

A tokenizer whose pieces might not encode like the whole (a prefix-adding pre-tokenizer such as
Metaspace's "first", a normalizer that rewrites text, added tokens that absorb neighbouring
spaces, a pattern that looks back) gets no cutter: its text is encoded whole. So does one that
fails a check at load: a sample cut into pieces of a few characters must encode like the whole.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from .byte_level import QWEN_SPLIT_PATTERN

QWEN_CUTS = re.compile(r"(?<=\n)(?=[!-~\w])|(?<=[!-~\w])(?=[ 0-9])")
"""Where Qwen's pre-tokenizer regex (:data:`QWEN_SPLIT_PATTERN`) always ends a pre-token: after a
newline and before a character that is not whitespace (``\\s*[\\r\\n]+`` and the punctuation
rule both end at the last newline), and after a character that is not whitespace, before a space
or an ASCII digit (no rule continues a pre-token into a space or a digit; digits stand alone).
Matching from a cut onward never looks back, and NFC never composes across these characters, so
text cut here pre-tokenizes, and therefore encodes, exactly as the whole text does. The
characters are ASCII or word characters, where Python's and Unicode's ideas of whitespace agree.
"""

CUT_WINDOW = 4096
"""Characters a generic cut looks past its target for a boundary that more pre-tokens follow."""

Cutter = Callable[[str, int, int], int]
"""``cut(text, start, size)``: the end of the piece of ``text`` that begins at ``start`` (a sound
cut), at least ``size`` characters on where the text allows; ``len(text)`` when no cut follows."""

_SAMPLE = (
    "def f(self, x):\n    return x + 12  # done\r\n\n\tit's 3.14... '  ll'll\n"
    "猫猫 é e\u0301 \u0301 \U0001f600 ab12cd __init__ ???\n\n\n   x  y   \n.\n"
)
_NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
_SAFE_PRE_TOKENIZERS = {"Split", "ByteLevel", "Digits", "Punctuation", "Whitespace"}


def cutter_for(tokenizer: Tokenizer) -> Cutter | None:
    """The sound cutter for ``tokenizer``, or None (encode whole)."""
    if _splits_like_qwen(tokenizer):
        return _qwen_cut
    if not _cuttable(tokenizer):
        return None
    cutter = PreTokenizerCuts(tokenizer)
    return cutter if _agrees(tokenizer, cutter) else None


def _qwen_cut(text: str, start: int, size: int) -> int:
    found = QWEN_CUTS.search(text, start + size)
    return found.start() if found is not None else len(text)


class PreTokenizerCuts:
    """Cuts at the boundaries the tokenizer's own pre-tokenizer draws (see the module doc)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        pre_tokenizer = tokenizer.pre_tokenizer
        assert pre_tokenizer is not None
        self._pre_tokenize = pre_tokenizer.pre_tokenize_str
        added = sorted(
            (token.content for token in tokenizer.get_added_tokens_decoder().values()),
            key=len,
            reverse=True,
        )
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._longest_added = max(map(len, added), default=0)
        normalizer = tokenizer.normalizer
        self._form = _state(normalizer)["type"] if normalizer is not None else None

    def __call__(self, text: str, start: int, size: int) -> int:
        target = start + size
        if target >= len(text):
            return len(text)
        end = min(len(text), target + CUT_WINDOW)
        if self._form is not None and not unicodedata.is_normalized(self._form, text[start:end]):
            return len(text)
        stops = self._stops(text, start, end)
        # At the text's end the window decided nothing; elsewhere keep two pre-tokens after.
        usable = len(stops) if end == len(text) else len(stops) - 2
        for cut in stops[:usable]:
            if (
                cut >= target
                and cut < len(text)
                and text[cut] < "\x80"
                and not text[cut - 1].isspace()
            ):
                return cut
        return len(text)

    def _stops(self, text: str, start: int, end: int) -> list[int]:
        """Where the pre-tokens of ``text[start:end]`` end, as the tokenizer splits it: at the
        added tokens first, then each stretch between them by the pre-tokenizer. An added token
        cut by the window's end is not seen whole: the window is shortened to before it."""
        stops: list[int] = []
        at = start
        found = self._added.finditer(text, start, end) if self._added is not None else ()
        for added in found:
            if added.end() == end and end < len(text) and self._longest_added > 1:
                end = added.start()  # it may go on past the window
                break
            stops += [at + stop for _, (_, stop) in self._pre_tokenize(text[at : added.start()])]
            stops.append(added.end())
            at = added.end()
        stops += [at + stop for _, (_, stop) in self._pre_tokenize(text[at:end])]
        return stops


def _splits_like_qwen(tokenizer: Tokenizer) -> bool:
    """Whether :data:`QWEN_CUTS` is sound for ``tokenizer``: NFC (or no normalizer), Qwen's split
    regex then byte-level mapping, and no added token containing a space or a newline."""
    normalizer = tokenizer.normalizer
    if normalizer is not None and _state(normalizer) != {"type": "NFC"}:
        return False
    pre_tokenizer = tokenizer.pre_tokenizer
    if pre_tokenizer is None:
        return False
    steps = _state(pre_tokenizer).get("pretokenizers", [])
    if [step.get("type") for step in steps] != ["Split", "ByteLevel"]:
        return False
    if steps[0].get("pattern") != {"Regex": QWEN_SPLIT_PATTERN} or steps[1].get("use_regex"):
        return False
    return not any(
        " " in token.content or "\n" in token.content
        for token in tokenizer.get_added_tokens_decoder().values()
    )


def _cuttable(tokenizer: Tokenizer) -> bool:
    """Whether the pieces of a generic cut can encode like the whole: only steps that act
    within pre-tokens, add nothing at the start and never look back."""
    if tokenizer.pre_tokenizer is None:
        return False
    normalizer = tokenizer.normalizer
    if normalizer is not None and _state(normalizer).get("type") not in _NORMAL_FORMS:
        return False
    pre = _state(tokenizer.pre_tokenizer)
    if not _all_safe(pre, "pretokenizers", _SAFE_PRE_TOKENIZERS):
        return False
    steps = pre.get("pretokenizers", [pre])
    for step in steps:
        if step.get("type") == "ByteLevel" and step.get("add_prefix_space"):
            return False
        pattern = step.get("pattern", {})
        if isinstance(pattern, dict) and "(?<" in str(pattern.get("Regex", "")):
            return False
    return not any(
        token.lstrip or token.rstrip or token.single_word
        for token in tokenizer.get_added_tokens_decoder().values()
    )


def _all_safe(state: dict[str, Any], nested: str, safe: set[str]) -> bool:
    steps = state.get(nested) if state.get("type") == "Sequence" else [state]
    return isinstance(steps, list) and all(step.get("type") in safe for step in steps)


def _agrees(tokenizer: Tokenizer, cut: Cutter) -> bool:
    """The check at load: a sample (with every added token in it) cut into pieces of one to a
    few characters, so that every boundary is tried, encodes exactly as the whole does."""
    added = "".join(token.content for token in tokenizer.get_added_tokens_decoder().values())
    text = (_SAMPLE + added) * 2
    (whole,) = tokenizer.encode_batch([text], add_special_tokens=False)
    for size in range(1, 7):
        pieces = []
        start = 0
        while start < len(text):
            end = cut(text, start, size)
            pieces.append(text[start:end])
            start = end
        encoded = tokenizer.encode_batch(pieces, add_special_tokens=False)
        if [token for piece in encoded for token in piece.ids] != list(whole.ids):
            return False
    return True


def _state(component: Any) -> dict[str, Any]:
    state = json.loads(component.__getstate__())
    assert isinstance(state, dict)
    return state
