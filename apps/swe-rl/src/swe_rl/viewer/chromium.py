"""Headless Chromium over the DevTools protocol: pictures of a viewer page, and a real browser
for the viewer's tests to drive (load, click, hover, read the rendered DOM).

Chromium runs with `--remote-debugging-pipe`: it reads commands on its fd 3 and writes answers
and events on its fd 4, as JSON messages ended by a NUL byte. So no port is opened and nothing
beyond the standard library is needed. It gets a fresh profile directory, deleted afterwards,
and its own session (process group), which is killed whole if it does not exit when asked. A
small reaper process stands between this process and Chromium, so no helper of Chromium is
left behind as a zombie.

    with Chromium() as browser:
        page = browser.open(viewer_html)
        page.evaluate("document.title")
        page.screenshot(Path("run.png"))
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

READY = "document.documentElement.dataset.ready === '1'"
"""True once the viewer's script has rendered the page."""

FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root in CI containers, where Chromium's own sandbox cannot start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


REAPER = """
import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
if os.fork() == 0:
    os.execv(sys.argv[1], sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"""
"""The browser's parent: Chromium exits before some of its helpers, which would otherwise be
left as zombies of pid 1 (not every container's init reaps). This reaps them all, then exits."""


class ChromiumError(RuntimeError):
    """Chromium is missing, did not answer in time, or reported an error."""


@dataclass(frozen=True, slots=True)
class ChromiumConfig:
    """`binary` is a command name or path; `timeout_s` bounds every wait for the browser."""

    binary: str = "chromium"
    timeout_s: float = 30.0


Message = dict[str, Any]


class Chromium:
    """One headless browser process (a context manager)."""

    def __init__(self, config: ChromiumConfig | None = None) -> None:
        self.config = config or ChromiumConfig()
        self._pid: int | None = None
        self._profile: str | None = None
        self._to_browser = -1
        self._from_browser = -1
        self._buffer = b""
        self._next_id = 0
        self._events: dict[str, list[Message]] = {}

    @property
    def pid(self) -> int | None:
        """The browser's process id (also its process group's), None when it is not running."""
        return self._pid

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        binary = shutil.which(self.config.binary)
        if binary is None:
            raise ChromiumError(
                f"{self.config.binary!r} not found (Debian: apt-get install chromium)"
            )
        self._profile = tempfile.mkdtemp(prefix="viewer-chromium-")
        try:
            self._spawn(binary)
            self.send("Target.setDiscoverTargets", {"discover": False})  # fails fast if dead
        except BaseException:
            self.close()
            raise

    def _spawn(self, binary: str) -> None:
        assert self._profile is not None
        commands_read, self._to_browser = _pipe()
        self._from_browser, events_write = _pipe()
        log = _above_4(os.open(self._log_path(), os.O_WRONLY | os.O_CREAT, 0o600))
        browser = [binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
        try:
            self._pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-c", REAPER, *browser],
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, commands_read, 3),
                    (os.POSIX_SPAWN_DUP2, events_write, 4),
                    (os.POSIX_SPAWN_DUP2, log, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                ],
                setsid=True,
            )
        finally:
            for fd in (commands_read, events_write, log):
                os.close(fd)

    def open(self, page: Path | str, *, width: int = 1400, height: int = 1000) -> Page:
        """A new tab showing `page` (a file or a URL), loaded and, if it is a viewer, rendered."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        tab = Page(self, target, session)
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=session)
        tab.resize(width, height)
        tab.goto(page.resolve().as_uri() if isinstance(page, Path) else page)
        return tab

    # -- the wire ------------------------------------------------------------------------------

    def send(self, method: str, params: Message | None = None, *, session: str = "") -> Message:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        command: Message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        data = json.dumps(command).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data) :]
        deadline = time.monotonic() + self.config.timeout_s
        while True:
            message = self._receive(deadline, method)
            if message.get("id") == command["id"]:
                if "error" in message:
                    raise ChromiumError(f"{method}: {message['error'].get('message')}")
                result: Message = message.get("result", {})
                return result
            self._events.setdefault(message.get("sessionId", ""), []).append(message)

    def wait_event(
        self, session: str, method: str, *, since: int = 0, timeout_s: float | None = None
    ) -> Message:
        """The first `method` event of `session` at or after index `since` of its event log."""
        deadline = time.monotonic() + (timeout_s or self.config.timeout_s)
        while True:
            for event in self.events(session)[since:]:
                if event.get("method") == method:
                    return event
            message = self._receive(deadline, method)
            self._events.setdefault(message.get("sessionId", ""), []).append(message)

    def events(self, session: str) -> list[Message]:
        return self._events.setdefault(session, [])

    def _receive(self, deadline: float, waiting_for: str) -> Message:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise ChromiumError(
                    f"no answer from Chromium within {self.config.timeout_s} s "
                    f"(waiting for {waiting_for}); see {self._log_path()}"
                )
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ChromiumError(
                    f"Chromium exited (waiting for {waiting_for}); see {self._log_path()}"
                )
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: Message = json.loads(raw)
        return message

    def _log_path(self) -> str:
        return os.path.join(self._profile or "", "chromium.log")

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Ask the browser to exit, kill its process group if it does not, delete the profile."""
        pid, self._pid = self._pid, None
        if pid is not None:
            try:
                command = {"id": self._next_id + 1, "method": "Browser.close", "params": {}}
                os.write(self._to_browser, json.dumps(command).encode() + b"\0")
            except OSError:
                pass  # already gone
            # Until it is reaped its pid (and so its group id) cannot be reused: kill the
            # group, the helpers it started among it, then reap.
            _exited(pid, 5.0)
            _kill_group(pid)
            os.waitpid(pid, 0)
        for fd in (self._to_browser, self._from_browser):
            if fd >= 0:
                os.close(fd)
        self._to_browser = self._from_browser = -1
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None


class Page:
    """One tab. Coordinates are CSS pixels of the viewport."""

    def __init__(self, browser: Chromium, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    def send(self, method: str, params: Message | None = None) -> Message:
        return self.browser.send(method, params, session=self.session)

    def resize(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def goto(self, url: str) -> None:
        since = len(self.browser.events(self.session))
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise ChromiumError(f"loading {url}: {answer['errorText']}")
        self.browser.wait_event(self.session, "Page.loadEventFired", since=since)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise)."""
        answer = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ChromiumError(f"{expression[:80]!r} threw: {text}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(f"Boolean({expression})"):
            if time.monotonic() > deadline:
                raise ChromiumError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.02)

    def center(self, selector: str) -> tuple[float, float]:
        """The viewport centre of the first element matching `selector`, scrolled into view."""
        box = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return null; el.scrollIntoView({block: 'center', inline: 'center'});"
            " const r = el.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            raise ChromiumError(f"no element matches {selector!r}")
        return float(box[0]), float(box[1])

    def mouse(self, kind: str, x: float, y: float) -> None:
        params: Message = {"type": kind, "x": x, "y": y, "button": "none"}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=1)
        self.send("Input.dispatchMouseEvent", params)

    def hover(self, selector: str) -> None:
        """Move the real mouse pointer onto the element (the page sees mouseover)."""
        self.mouse("mouseMoved", *self.center(selector))

    def click(self, selector: str) -> None:
        """Press and release the left button on the element."""
        x, y = self.center(selector)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.mouse(kind, x, y)

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        shot = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full_page}
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def requested_urls(self) -> list[str]:
        """Every URL the tab asked the network stack for since it opened."""
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events(self.session)
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and browser-reported errors (such as a content
        policy refusing something) since the tab opened."""
        found: list[str] = []
        for event in self.browser.events(self.session):
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details["text"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def screenshot(
    viewer: Path,
    png: Path,
    *,
    width: int = 1400,
    height: int = 1000,
    prepare: Callable[[Page], None] | None = None,
    config: ChromiumConfig | None = None,
) -> Path:
    """A PNG of a viewer page once rendered; `prepare` may click around first."""
    with Chromium(config) as browser:
        page = browser.open(viewer, width=width, height=height)
        page.wait_for(READY)
        if prepare is not None:
            prepare(page)
        return page.screenshot(png)


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    return _above_4(read), _above_4(write)


def _above_4(fd: int) -> int:
    """`fd` moved to a number above 4 (close-on-exec kept), so mapping descriptors onto the
    child's 1-4 never overwrites one that a later mapping still reads (and dup2 onto itself,
    which would keep close-on-exec set, cannot happen)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def _exited(pid: int, timeout_s: float) -> None:
    """Wait up to `timeout_s` for `pid` to exit, leaving it unreaped."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        time.sleep(0.02)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
