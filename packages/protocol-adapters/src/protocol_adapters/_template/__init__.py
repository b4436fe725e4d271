"""What a chat template is and accepts: the jinja template, the messages it is given, and the
probes that learn what it writes around messages (one request context at a time)."""

from .context import Slot, TemplateContext
from .messages import ToolResultNames
from .template import ChatTemplate, TemplateError, qwen3_template

__all__ = [
    "ChatTemplate",
    "Slot",
    "TemplateContext",
    "TemplateError",
    "ToolResultNames",
    "qwen3_template",
]
