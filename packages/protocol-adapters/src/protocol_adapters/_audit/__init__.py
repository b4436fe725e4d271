"""The audit a template passes once, at load: which scenarios it renders as the bridge needs,
what differs where not, and the verdict that decides which modes may serve it."""

from .audit import audit_source, audit_template
from .verdict import (
    Finding,
    FindingKind,
    TemplateAudit,
    TemplateMode,
    TemplateRefused,
    Verdict,
)

__all__ = [
    "Finding",
    "FindingKind",
    "TemplateAudit",
    "TemplateMode",
    "TemplateRefused",
    "Verdict",
    "audit_source",
    "audit_template",
]
