"""slime's ``--dynamic-sampling-filter-path`` under fan-out: DAPO's dynamic sampling, per episode.

DAPO drops a prompt's group when all its answers earned the same reward: every advantage of the
group is 0, so it trains nothing and takes a slot of the batch. slime's default rollout calls
``filter(args, group)`` on each finished group and, when the filter says drop, samples another
prompt (``--over-sampling-batch-size``). ``group`` is the group's generate results: here each is
a *list* of samples (one per branch of the episode), and slime's own filters
(``slime.rollout.filter_hub.dynamic_sampling_filters``) crash on it; the generate function refuses
them by name. Use one of these instead (``extra_args`` of the launcher's run file)::

    --dynamic-sampling-filter-path slime_backend.dynamic_filter.check_reward_nonzero_std
    --dynamic-sampling-filter-path \
        slime_backend.dynamic_filter.check_reward_nonzero_std_with_fallback

Each episode counts once, however many samples it returned, with the reward hook's rule
(:mod:`slime_backend.reward_hook`): an episode with an ``aborted`` sample (an aborted episode, or
one with nothing to train) is outside its group's baseline. A group is dropped when the rewards
of its episodes have no spread (sample standard deviation at most ``1e-6``, as slime's filter),
and only when every one of its episodes is in the baseline: a group holding an aborted or
untrainable episode is kept, so the silent-failure gates (which see only the kept groups) count
it. Plain samples (another generate function's) are one episode each.

The ``_with_fallback`` variant, like slime's, keeps a rejected group when dropping it would leave
too few candidates to fill the batch, instead of sampling another round: with a policy that
solves all or nothing of most prompts, the plain filter can draw prompts for a long time.

A filter of your own that handles lists of samples is accepted once marked with
:func:`fan_out_aware`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._fan_out import FAN_OUT_AWARE
from ._grpo import EPSILON, sample_std
from ._slime_api import filter_output_class
from .reward_hook import episode_rewards

F = TypeVar("F", bound=Callable[..., Any])


def fan_out_aware(function: F) -> F:
    """Mark a dynamic-sampling filter as handling groups whose results are lists of samples."""
    setattr(function, FAN_OUT_AWARE, True)
    return function


@fan_out_aware
def check_reward_nonzero_std(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """slime's filter signature; ``samples`` is one group's generate results. Returns slime's
    ``DynamicFilterOutput`` (``keep``, and a ``reason`` slime counts in its rollout metrics as
    ``rollout/dynamic_filter/drop_<reason>``)."""
    results = [r if isinstance(r, list) else [r] for r in samples]
    episodes = episode_rewards(args, [s for result in results for s in result])
    output = filter_output_class()
    if not episodes or any(not e.in_baseline for e in episodes.values()):
        return output(keep=True)
    rewards = [e.reward for e in episodes.values()]
    mean = sum(rewards) / len(rewards)
    keep = sample_std(rewards, mean) > EPSILON
    return output(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


@fan_out_aware
def check_reward_nonzero_std_with_fallback(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """:func:`check_reward_nonzero_std`, keeping a rejected group when slime would otherwise
    have to sample another round to fill the batch."""
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output
