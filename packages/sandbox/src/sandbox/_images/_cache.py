"""The node's image cache, as the event loop sees it: `ImageCache.acquire` and its leases.

All the work (resolving, pulling, unpacking, evicting) is blocking code in `_store` and the
sources, run in worker threads. What this module adds is sharing within the process: sixteen
tasks acquiring one image at once join one pull (other processes are kept out by the pull's
file lock), and each then holds a lease of its own.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sandbox._images._config import ImageCacheConfig, ImageConfig
from sandbox._images._errors import ImagePullError, PullFailure
from sandbox._images._layout import LayoutSource
from sandbox._images._reference import parse_reference
from sandbox._images._registry import RegistrySource
from sandbox._images._store import HeldImage, Source, Store
from sandbox._spec import OciLayoutImage, RegistryImage


class ImageLease:
    """An unpacked image the caller may use until `release()`: its root (to be mounted
    read-only; never write to it) and its configuration. While any lease on an image is held,
    in any process, eviction leaves the image alone."""

    def __init__(self, root: Path, config: ImageConfig, lock_fd: int) -> None:
        self.root = root
        self.config = config
        self._lock_fd = lock_fd

    async def release(self) -> None:
        """Give the lease back (idempotent)."""
        self._close()

    def _close(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)

    async def __aenter__(self) -> ImageLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.release()

    def __del__(self) -> None:
        if getattr(self, "_lock_fd", -1) >= 0:
            warnings.warn(f"unreleased image lease on {self.root}", ResourceWarning, stacklevel=2)
            self._close()

    def __repr__(self) -> str:
        return f"ImageLease({self.config.digest}, root={str(self.root)!r})"


@dataclass(slots=True)
class _Flight:
    """One pull in progress in this process, and how many tasks wait for it. The pull's own
    lease keeps the image from eviction until the last of them has a lease of its own."""

    task: asyncio.Task[HeldImage]
    waiters: int = 0


class ImageCache:
    """Registry images and OCI layouts unpacked once per node, shared by every sandbox."""

    def __init__(self, config: ImageCacheConfig) -> None:
        self.config = config
        self._store: Store | None = None
        self._flights: dict[tuple[str, ...], _Flight] = {}
        self._sweeping = False

    async def acquire(self, image: RegistryImage | OciLayoutImage) -> ImageLease:
        """A lease on `image`, unpacked; pulled first unless the cache has it. Raises
        `ImagePullError` naming the image and what failed."""
        name = _describe(image)
        try:
            held = await self._acquire(image)
        except PullFailure as error:
            raise ImagePullError(name, str(error)) from None
        except OSError as error:
            raise ImagePullError(name, f"image cache error: {error}") from error
        lease = ImageLease(held.root, held.config, held.lock_fd)
        try:
            await self._sweep()
        except BaseException:  # cancelled: the caller never sees the lease
            lease._close()
            raise
        return lease

    async def _acquire(self, image: RegistryImage | OciLayoutImage) -> HeldImage:
        key = _key(image)
        flight = self._flights.get(key)
        if flight is None:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._pull, image))
            flight = _Flight(task)
            self._flights[key] = flight
            task.add_done_callback(lambda _: self._landed(key, flight))
        flight.waiters += 1
        try:
            shared = await asyncio.shield(flight.task)
            store = self._store
            assert store is not None
            leasing = asyncio.ensure_future(
                asyncio.to_thread(store.try_lease, shared.config.digest)
            )
            try:
                held = await asyncio.shield(leasing)
            except asyncio.CancelledError:
                leasing.add_done_callback(_drop_unwanted)  # its lease would have no holder
                raise
            if held is None:  # cannot happen while the pull's lease is held
                raise PullFailure("the image vanished from the cache")
            return held
        finally:
            flight.waiters -= 1
            self._landed(key, flight)

    def _landed(self, key: tuple[str, ...], flight: _Flight) -> None:
        """Once the pull is over and nobody waits for it: forget it, drop its lease."""
        if not flight.task.done() or flight.waiters:
            return
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.task.cancelled() and flight.task.exception() is None:
            held = flight.task.result()
            if held.lock_fd >= 0:
                os.close(held.lock_fd)
                held.lock_fd = -1

    def _pull(self, image: RegistryImage | OciLayoutImage) -> HeldImage:
        if self._store is None:
            self._store = Store(self.config.root)
        store = self._store
        source: Source
        if isinstance(image, RegistryImage):
            source = RegistrySource(parse_reference(image.reference), self.config, store)
        else:
            source = LayoutSource(
                Path(os.path.abspath(image.path)), image.ref, self.config.platform
            )
        try:
            return store.acquire(source)
        finally:
            source.close()

    async def _sweep(self) -> None:
        if self._sweeping or self._store is None:
            return
        self._sweeping = True
        try:
            await asyncio.to_thread(self._store.sweep, self.config.max_bytes)
        except OSError as error:
            warnings.warn(f"image cache sweep failed: {error}", RuntimeWarning, stacklevel=2)
        finally:
            self._sweeping = False


def _drop_unwanted(leasing: asyncio.Future[HeldImage | None]) -> None:
    if not leasing.cancelled() and leasing.exception() is None:
        held = leasing.result()
        if held is not None:
            os.close(held.lock_fd)


def _key(image: RegistryImage | OciLayoutImage) -> tuple[str, ...]:
    if isinstance(image, RegistryImage):
        return ("registry", image.reference)
    return ("layout", os.path.abspath(image.path), image.ref or "")


def _describe(image: RegistryImage | OciLayoutImage) -> str:
    if isinstance(image, RegistryImage):
        return image.reference
    return f"{image.path}:{image.ref}" if image.ref else str(image.path)
