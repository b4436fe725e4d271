"""SWE tasks for agent RL: episodes, grading, the demo, the CLI and the trajectory viewer.

An application, not a library: its interface is the ``swe-rl`` command (``uv run apps/swe-rl``).
Its modules serve that command; it exports nothing, and it is never released to PyPI.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # The version comes from the installed metadata (pyproject.toml is its one source), read
        # on first use: importing importlib.metadata costs more than importing this package.
        if name == "__version__":
            from importlib.metadata import version

            return version("agent-rl-swe-rl")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
