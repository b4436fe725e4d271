"""Images in the OpenAI shape, shared by Chat Completions and Responses.

Both carry an image as one URL: a link, or a ``data:`` URL with the bytes inline. The neutral
:class:`Media` type is the data URL's own media type (what Anthropic's base64 sources yield too),
else just ``image``. Where the URL sits in a content part differs per dialect, so each reads it
there itself. (Anthropic names a ``source`` object instead: ``anthropic.py`` reads those.)
"""

from __future__ import annotations

from trajectory_tree import Media


def image_media(url: str) -> Media:
    """The neutral block for an image given by ``url``."""
    return Media(_data_url_type(url) or "image", url)


def _data_url_type(url: str) -> str | None:
    """The media type of a ``data:`` URL (``data:image/png;base64,...`` -> ``image/png``)."""
    if not url.startswith("data:"):
        return None
    head = url[5:].split(",", 1)[0]
    return head.split(";", 1)[0] or None
