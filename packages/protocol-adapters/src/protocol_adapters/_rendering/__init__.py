"""Prompt rendering: chat templates, their audit, the bridge onto the session tree's tokens."""

from .audit import audit_source, audit_template
from .renderer import PromptTooLong, RenderedPrompt, Renderer, RendererConfig
from .stats import BridgeStats
from .template import ChatTemplate, TemplateError, qwen3_template
from .template_messages import ToolResultNames
from .verdict import (
    Finding,
    FindingKind,
    TemplateAudit,
    TemplateMode,
    TemplateRefused,
    Verdict,
)

__all__ = [
    "BridgeStats",
    "ChatTemplate",
    "Finding",
    "FindingKind",
    "PromptTooLong",
    "RenderedPrompt",
    "Renderer",
    "RendererConfig",
    "TemplateAudit",
    "TemplateError",
    "TemplateMode",
    "TemplateRefused",
    "ToolResultNames",
    "Verdict",
    "audit_source",
    "audit_template",
    "qwen3_template",
]
