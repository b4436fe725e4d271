"""Several adapter processes behind one admin API (``protocol-adapters serve --processes N``).

One process tops out near one core: a streamed turn costs ~13 ms of adapter CPU, about 7 of them
on its event loop thread. A node scales by running N complete adapters (``worker.py``), started
and restarted by the ``serve`` process (``supervisor.py``), which answers the admin API alone and
forwards each call to the worker that owns the session (``front.py``), pinned by its session id
(``pinning.py``). ``service.py`` puts them together.
"""

from .pinning import worker_for
from .service import FleetConfig, FleetError, serve_fleet
from .worker import Failed, Serving, WorkerPlan, WorkerTarget, die_with_parent, watch_parent

__all__ = [
    "Failed",
    "FleetConfig",
    "FleetError",
    "Serving",
    "WorkerPlan",
    "WorkerTarget",
    "die_with_parent",
    "serve_fleet",
    "watch_parent",
    "worker_for",
]
