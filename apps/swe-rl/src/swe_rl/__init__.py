"""SWE tasks for agent RL: episodes, grading, the demo, the CLI and the trajectory viewer."""

from importlib.metadata import version as _distribution_version

__version__ = _distribution_version("agent-rl-swe-rl")  # pyproject.toml is the one source
