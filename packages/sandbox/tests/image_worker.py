"""A separate process using the same image cache, for the tests that need two processes.

    python image_worker.py '<json>'

The JSON names the cache (`root`, `plain_http`, `credentials` as {host: [user, password]},
`max_bytes`) and the image (`reference`, or `layout` and `ref`). The worker acquires the image,
prints the lease's root on a line of its own, and then, with `"hold": true`, keeps the lease
until its standard input closes; it exits 0, or 1 with the error on stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from sandbox._images import ImageCache, ImageCacheConfig, ImagePullError, RegistryCredentials
from sandbox._spec import OciLayoutImage, RegistryImage


async def main(options: dict[str, Any]) -> int:
    config = ImageCacheConfig(
        root=Path(options["root"]),
        plain_http=tuple(options.get("plain_http", ())),
        credentials={
            host: RegistryCredentials(user, password)
            for host, (user, password) in options.get("credentials", {}).items()
        },
        max_bytes=options.get("max_bytes"),
    )
    image: RegistryImage | OciLayoutImage
    if "reference" in options:
        image = RegistryImage(options["reference"])
    else:
        image = OciLayoutImage(Path(options["layout"]), options.get("ref"))
    try:
        lease = await ImageCache(config).acquire(image)
    except ImagePullError as error:
        print(error, file=sys.stderr)
        return 1
    print(lease.root, flush=True)
    if options.get("hold"):
        await asyncio.to_thread(sys.stdin.read)
    await lease.release()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
