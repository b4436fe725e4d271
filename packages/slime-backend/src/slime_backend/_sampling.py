"""slime's ``sampling_params`` -> the adapter's rollout sampling, which wins over the client's.

The policy is trained under the rollout's sampling settings, so the agent CLI's own temperature
or ``max_tokens`` never decide how the engine samples (the client's ``max_tokens`` still caps a
reply, as does the room left in the context). What the adapters can apply is taken from the dict
slime builds (docs/slime-contract.md, section 2): temperature, top-p, top-k, ``max_new_tokens``,
``stop`` strings (``--rollout-stop``: sent beside the agent's own, a reply ending on one keeps it
in its recorded ids) and ``min_p`` (slime has no flag for it; a caller driving the generate
function may set it). What they cannot apply is refused by name rather than silently dropped:

- ``custom_params`` (top-p replay), ``sampling_seed`` (deterministic inference) and any penalty
  or minimum length an evaluation config sets;
- ``stop_token_ids`` other than the tokens the checkpoint already ends turns with (the adapters
  always stop there and keep the stop token in the recorded ids).

``skip_special_tokens``, ``no_stop_trim`` and ``spaces_between_special_tokens`` only shape
detokenized text; the adapters work on ids, keep stop tokens and decode with every special token
spelled out, so these are accepted and have no effect.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from protocol_adapters import RolloutSampling

from ._typed_config import ConfigError

TEXT_ONLY = frozenset({"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"})
APPLIED = frozenset({"temperature", "top_p", "top_k", "max_new_tokens", "min_p", "stop"})

NEUTRAL: dict[str, tuple[object, ...]] = {
    "custom_params": (None, {}),
    "sampling_seed": (None,),
    "min_new_tokens": (None, 0),
    "repetition_penalty": (None, 1.0),
    "frequency_penalty": (None, 0.0),
    "presence_penalty": (None, 0.0),
}
"""Keys the adapters cannot apply, with the values that ask for nothing."""


def rollout_sampling(params: Mapping[str, Any], stop_ids: Collection[int]) -> RolloutSampling:
    """The adapter's sampling for one generate call's ``sampling_params``.

    ``stop_ids`` are the ids the checkpoint ends a turn with. Raises :class:`ConfigError` naming
    ``sampling_params.<key>`` for anything the adapters would have to ignore.
    """
    for key, value in params.items():
        if key in TEXT_ONLY or key in APPLIED:
            continue
        if key == "stop_token_ids":
            extra = sorted(set(value or ()) - set(stop_ids))
            if extra:
                raise _error(
                    key,
                    f"{extra} are not tokens the checkpoint ends a turn with "
                    f"({sorted(stop_ids)}): the adapters stop only there",
                )
            continue
        if key not in NEUTRAL:
            raise _error(key, "is not a sampling parameter the adapters know")
        if value not in NEUTRAL[key]:
            raise _error(key, f"{value!r} cannot be applied by the adapters")
    temperature = _number(params, "temperature", 1.0)
    top_p = _number(params, "top_p", 1.0)
    top_k = _integer(params, "top_k")
    top_k = -1 if top_k is None else top_k
    max_new_tokens = _integer(params, "max_new_tokens")
    min_p = _number(params, "min_p", 0.0)
    stop = _stop(params.get("stop"))
    if temperature < 0:
        raise _error("temperature", f"must not be negative, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise _error("top_p", f"must be in (0, 1], got {top_p}")
    if top_k != -1 and top_k < 1:
        raise _error("top_k", f"must be -1 (off) or positive, got {top_k}")
    if max_new_tokens is None or max_new_tokens < 1:
        raise _error("max_new_tokens", f"must be a positive int, got {max_new_tokens!r}")
    if not 0.0 <= min_p <= 1.0:
        raise _error("min_p", f"must be in [0, 1], got {min_p}")
    return RolloutSampling(
        temperature, top_p, top_k, max_new_tokens=max_new_tokens, min_p=min_p, stop=stop
    )


def _stop(value: object) -> tuple[str, ...]:
    """slime's ``--rollout-stop`` (a list, ``None`` when unset; a dataset config may give one
    string): each a non-empty string."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) and s for s in items):
        raise _error("stop", f"expected non-empty strings, got {value!r}")
    return tuple(dict.fromkeys(items))


def _number(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(key, f"expected a number, got {value!r}")
    return float(value)


def _integer(params: Mapping[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(key, f"expected an int, got {value!r}")
    return value


def _error(key: str, message: str) -> ConfigError:
    return ConfigError(f"sampling_params.{key}", message)
