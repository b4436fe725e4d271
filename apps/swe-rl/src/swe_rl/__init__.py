"""SWE tasks for agent RL: episodes, grading, the demo, the CLI and the trajectory viewer."""

__version__ = "0.1.0"
