"""Prompt rendering: chat templates, the bridge onto the session tree's tokens, token counting."""

from .renderer import RenderedPrompt, Renderer, RendererConfig
from .stats import BridgeStats
from .template import ChatTemplate, TemplateError, qwen3_template

__all__ = [
    "BridgeStats",
    "ChatTemplate",
    "RenderedPrompt",
    "Renderer",
    "RendererConfig",
    "TemplateError",
    "qwen3_template",
]
