"""Anthropic, OpenAI Chat Completions and OpenAI Responses over SGLang /generate."""

__version__ = "0.1.0"
