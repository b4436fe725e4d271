"""Assertions shared by the server tests: the trust property, checked token by token."""

from __future__ import annotations

from protocol_adapters.testing.trust import check_engine_tokens_trained

assert_engine_tokens_trained = check_engine_tokens_trained
