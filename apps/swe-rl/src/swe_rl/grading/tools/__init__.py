"""Scripts the grader copies into the grading sandbox and runs there with the task's Python.

They import nothing of this project (only the standard library, and pytest for
pytest_runner.py) and run on Python 3.7 or newer.
"""
