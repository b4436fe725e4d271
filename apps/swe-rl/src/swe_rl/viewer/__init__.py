"""The trajectory viewer: one self-contained HTML file per run, for people who must trust every
token they train on.

    from swe_rl.viewer import write_viewer
    page = write_viewer(run_dir, lambda token: vocabulary.decode([token]))  # <run>/viewer.html

Per episode: the session tree as a branch diagram (main agent, sub-agents, compaction restarts,
retries), every model call's request, reply, tool calls and results, each sample's tokens
coloured by loss mask and by the reason of every masked span (hover for id, logprob, reason),
reward and advantage, grading's verdict (refused files flagged on the card), and the run's
silent-failure alarms. Nothing is fetched: data, style and script are in the file, and its
content policy forbids the network.
"""

from .chromium import Chromium, ChromiumConfig, ChromiumError, screenshot
from .episode_view import ViewerError
from .run_dir import RunDirError
from .writer import VIEWER_FILE, write_viewer

__all__ = [
    "VIEWER_FILE",
    "Chromium",
    "ChromiumConfig",
    "ChromiumError",
    "RunDirError",
    "ViewerError",
    "screenshot",
    "write_viewer",
]
