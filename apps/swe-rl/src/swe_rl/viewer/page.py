"""The page: one self-contained HTML file, its data embedded, nothing fetched.

Layout: the head (style and policy), one JSON block per episode's detail (parsed by the script
only when that episode is opened), the run's index (cards, alarms, legend) and the script. The
writer streams these pieces, so a run of many long episodes never sits in memory whole. A
Content-Security-Policy allows exactly the page's own style and script (by hash) and no network
at all: even a bug that slipped model output into markup could neither run it nor load anything.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
from importlib import resources

from .embed import script_json

INDEX_ID = "run-data"


def episode_block_id(index: int) -> str:
    return f"episode-{index}"


def head(title: str) -> str:
    css, js = _assets()
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src '{_sha256(js)}'",
            f"style-src '{_sha256(css)}'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
        )
    )
    return "\n".join(
        (
            "<!doctype html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_ascii_html(title)} - trajectories</title>",
            f"<style>{css}</style>",
            "</head>",
            "<body>",
            '<main id="app"><noscript>This viewer needs JavaScript.</noscript></main>',
            "",
        )
    )


def data_block(element_id: str, json_text: str) -> str:
    """A JSON block; `json_text` must come from :func:`~swe_rl.viewer.embed.script_json`."""
    return f'<script type="application/json" id="{element_id}">{json_text}</script>\n'


def tail(index: dict[str, object]) -> str:
    _, js = _assets()
    return data_block(INDEX_ID, script_json(index)) + f"<script>{js}</script>\n</body>\n</html>\n"


@functools.cache
def _assets() -> tuple[str, str]:
    folder = resources.files(__package__) / "assets"
    return (
        (folder / "viewer.css").read_text(encoding="ascii"),
        (folder / "viewer.js").read_text(encoding="ascii"),
    )


def _ascii_html(text: str) -> str:
    """`text` escaped for HTML, with anything beyond ASCII as a character reference."""
    return html.escape(text).encode("ascii", "xmlcharrefreplace").decode("ascii")


def _sha256(text: str) -> str:
    digest = hashlib.sha256(text.encode("ascii")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")
