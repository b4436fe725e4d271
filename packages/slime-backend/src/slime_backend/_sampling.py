"""slime's ``sampling_params`` -> the adapter's rollout sampling, which wins over the client's.

The policy is trained under the rollout's sampling settings, so the agent CLI's own temperature
or ``max_tokens`` never decide how the engine samples (the client's ``max_tokens`` still caps a
reply, as does the room left in the context). What the adapters can apply is taken from the dict
slime builds (docs/slime-contract.md, section 2); what they cannot apply is refused by name
rather than silently dropped:

- ``stop`` strings (``--rollout-stop``), ``custom_params`` (top-p replay), ``sampling_seed``
  (deterministic inference) and any penalty or minimum length an evaluation config sets;
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

NEUTRAL: dict[str, tuple[object, ...]] = {
    "stop": (None, [], ()),
    "custom_params": (None, {}),
    "sampling_seed": (None,),
    "min_new_tokens": (None, 0),
    "repetition_penalty": (None, 1.0),
    "frequency_penalty": (None, 0.0),
    "presence_penalty": (None, 0.0),
    "min_p": (None, 0.0),
}
"""Keys the adapters cannot apply, with the values that ask for nothing."""


def rollout_sampling(params: Mapping[str, Any], stop_ids: Collection[int]) -> RolloutSampling:
    """The adapter's sampling for one generate call's ``sampling_params``.

    ``stop_ids`` are the ids the checkpoint ends a turn with. Raises :class:`ConfigError` naming
    ``sampling_params.<key>`` for anything the adapters would have to ignore.
    """
    for key, value in params.items():
        if key in TEXT_ONLY or key in ("temperature", "top_p", "top_k", "max_new_tokens"):
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
    if temperature < 0:
        raise _error("temperature", f"must not be negative, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise _error("top_p", f"must be in (0, 1], got {top_p}")
    if top_k != -1 and top_k < 1:
        raise _error("top_k", f"must be -1 (off) or positive, got {top_k}")
    if max_new_tokens is None or max_new_tokens < 1:
        raise _error("max_new_tokens", f"must be a positive int, got {max_new_tokens!r}")
    return RolloutSampling(temperature, top_p, top_k, max_new_tokens=max_new_tokens)


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
