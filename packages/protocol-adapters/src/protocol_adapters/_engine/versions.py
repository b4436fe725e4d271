"""Which weight version generated which tokens of a streamed call.

SGLang names its current ``weight_version`` in every streamed chunk. When the trainer pauses the
engine in place for a weight update, a running stream continues afterwards under the new weights
and its later chunks say so: a chunk's version is the one its new tokens were generated under.
"""

from __future__ import annotations

from trajectory_tree import VersionRun


class VersionRuns:
    """Collects ``(first output index, version)`` runs from the chunks of one stream."""

    def __init__(self) -> None:
        self._runs: list[VersionRun] = []
        self._tokens = 0
        self._last: str | None = None
        self._unknown = False

    def add(self, new_tokens: int, version: str | None) -> None:
        """One chunk: ``new_tokens`` tokens generated under ``version``."""
        if version is not None:
            self._last = version
        if not new_tokens:
            return
        if version is None:
            self._unknown = True
        elif not self._runs or self._runs[-1][1] != version:
            self._runs.append((self._tokens, version))
        self._tokens += new_tokens

    @property
    def runs(self) -> tuple[VersionRun, ...]:
        """The runs; none when some tokens came without a version (then nothing is claimed)."""
        return () if self._unknown else tuple(self._runs)

    @property
    def version(self) -> str | None:
        """The version the call finished on: the last run's, else the last one reported.

        A version that changed after the last token (on a final chunk without tokens) generated
        nothing of this call, so it is not the call's.
        """
        runs = self.runs
        return runs[-1][1] if runs else self._last
