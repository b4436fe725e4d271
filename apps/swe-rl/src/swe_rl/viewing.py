"""`swe-rl view`: (re)write a run's viewer from what the run recorded.

run.json names the checkpoint whose tokenizer decodes the run's tokens and the conversion
options its samples were cut with, so the page shows exactly what was trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from protocol_adapters import CheckpointError, load_checkpoint
from slime_backend import ConfigError, ConversionOptions, from_mapping
from swe_rl.errors import UsageError
from swe_rl.viewer import RunDirError, write_viewer


def write_run_viewer(run_dir: Path, checkpoint: Path | None = None) -> Path:
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"{run_dir} holds no readable run.json: {error.strerror}") from None
    except ValueError as error:
        raise UsageError(f"{run_dir / 'run.json'} is not JSON: {error}") from None
    directory = checkpoint or (Path(run["checkpoint"]) if run.get("checkpoint") else None)
    if directory is None:
        raise UsageError("run.json names no checkpoint: pass --checkpoint DIR")
    try:
        vocabulary = load_checkpoint(directory).vocabulary
        options = from_mapping(ConversionOptions, run.get("conversion", {}), "conversion")
        return write_viewer(run_dir, lambda token: vocabulary.decode([token]), options=options)
    except (OSError, CheckpointError) as error:
        raise UsageError(f"checkpoint {directory}: {error}") from None
    except (ConfigError, RunDirError) as error:
        raise UsageError(f"{run_dir}: {error}") from None
