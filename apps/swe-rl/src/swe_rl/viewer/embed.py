"""JSON that can sit inside an HTML `<script>` element and never end it.

The page embeds model output (token text, tool calls, tool results) as data. Inside a script
element the HTML parser looks only for `</script` (and `<!--`), so escaping every `<`, `>` and
`&` as a JSON unicode escape makes any string inert, while `JSON.parse` still reads back exactly
the same text. Non-ASCII is escaped too: lone surrogates (which clients can send and trees keep)
then survive, and the page is plain ASCII.
"""

from __future__ import annotations

import json

_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value: object) -> str:
    """`value` as JSON text for a `<script type="application/json">` element.

    Raises ValueError for NaN or infinite numbers, which JSON cannot carry.
    """
    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).translate(
        _ESCAPES
    )
