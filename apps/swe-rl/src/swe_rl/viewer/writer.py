"""`write_viewer`: a run directory in, `<run>/viewer.html` out."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from slime_backend import ConversionOptions
from swe_rl.run_record import RunRecord

from .episode_view import Decode, episode_view
from .legend import legend
from .page import data_block, episode_block_id, head, tail
from .run_dir import read_run

VIEWER_FILE = "viewer.html"


def write_viewer(
    run_dir: Path, decode: Decode, *, options: ConversionOptions | None = None
) -> Path:
    """Write `run_dir/viewer.html` and return its path.

    `decode` turns one token id into its text (e.g. `lambda i: vocabulary.decode([i])`).
    `options` are the conversion options the run trained with (how samples were cut and
    rewarded), so the masks shown are the masks trained; the default is slime-backend's.
    Raises `RunDirError` when `run.json` is unusable; an episode whose own files are broken is
    shown with its error instead. Episodes are built and written one at a time.
    """
    run = read_run(run_dir)
    options = options or ConversionOptions()
    target = run_dir / VIEWER_FILE
    fd, partial = tempfile.mkstemp(dir=run_dir, prefix=".viewer-", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as page:
            page.write(head(run.title))
            cards: list[dict[str, Any]] = []
            for number, entry in enumerate(run.episodes):
                view = episode_view(entry, run_dir, decode, options)
                page.write(data_block(episode_block_id(number), view.detail))
                cards.append(view.card)
            page.write(tail(_index(run, options, cards)))
        os.chmod(partial, 0o644)
        os.replace(partial, target)  # a browser reloading the file never sees half a page
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def _index(
    run: RunRecord, options: ConversionOptions, cards: list[dict[str, Any]]
) -> dict[str, Any]:
    """The run's facts the page reads first: header, alarms, legend and one card per episode."""
    return {
        "title": run.title,
        "policy": run.policy,
        "agent": run.agent,
        "alarms": [dataclasses.asdict(alarm) for alarm in run.alarms],
        "interrupted": run.interrupted,
        "legend": legend(),
        "conversion": {
            "max_sample_tokens": options.max_sample_tokens,
            "length_mode": str(options.length_mode),
            "reward_policy": str(options.reward_policy),
        },
        "episodes": cards,
    }
