"""Prompt rendering: chat templates, the bridge onto the session tree's tokens, token counting."""

from .renderer import PromptTooLong, RenderedPrompt, Renderer, RendererConfig
from .stats import BridgeStats
from .template import ChatTemplate, TemplateError, qwen3_template

__all__ = [
    "BridgeStats",
    "ChatTemplate",
    "PromptTooLong",
    "RenderedPrompt",
    "Renderer",
    "RendererConfig",
    "TemplateError",
    "qwen3_template",
]
