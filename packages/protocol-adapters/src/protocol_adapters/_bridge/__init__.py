"""The per-turn bridge onto the session tree's tokens, and the renderer's policy around it."""

from .bridge import PromptTooLong
from .renderer import RenderedPrompt, Renderer, RendererConfig
from .stats import BridgeStats

__all__ = ["BridgeStats", "PromptTooLong", "RenderedPrompt", "Renderer", "RendererConfig"]
