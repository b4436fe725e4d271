"""A :class:`RunnerConfig` as argv: slime's ``train.py`` command and its ``ray job submit``.

Three facts shape this module (docs/slime-contract.md has the evidence):

- slime parses its Megatron half with unknown arguments *ignored*: a misspelled flag is silently
  dropped. So every flag emitted here is checked by the tests against the flags slime's parser
  defines at the pinned commit, and ``extra_args`` may not repeat a flag we set.
- ``ray job submit`` joins the entrypoint with ``subprocess.list2cmdline`` and the job runs it with
  ``/bin/sh``. A value the shell would reinterpret (``$``, ``;``, a glob) is refused with the field
  that holds it, instead of reaching slime altered.
- Some slime features break with a generate function that returns several samples per episode, or
  bypass our hooks; the whole command is checked with the generate function's own check
  (:func:`slime_backend._fan_out.refusals`, :data:`REFUSED_FLAGS`), so ``extra_args`` cannot turn
  them on.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterable

from slime_backend._fan_out import GATE_HOOK, REWARD_HOOK, RULES, command_values, refusals
from slime_backend._typed_config import ConfigError

from ._config import RunnerConfig

ROUTER_POLICY = "consistent_hashing"
"""Keeps a session's calls on one engine: the adapters send ``X-SMG-Routing-Key`` per session."""
CUSTOM_CONFIG_FILE = "agent_rl.yaml"

RUNTIME_ENV_DEFAULTS = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
"""What slime's own launch scripts put in the job's environment besides ``PYTHONPATH``."""

REFUSED_FLAGS = {rule.flag: rule.reason for rule in RULES}
"""slime flags the command may not set (or only to some values), with the reason: the same
check the generate function applies to slime's ``args`` on its first call."""

_OURS = "slime_backend's wiring"
_PLAIN = frozenset(string.ascii_letters + string.digits + '_@%+=:,./{}-"')
_NEVER = frozenset("$`\\\n")


def survives_ray_entrypoint(token: str) -> bool:
    """Whether ``/bin/sh`` gives back exactly ``token`` after ``list2cmdline`` joined it.

    A token with a space or tab is double-quoted by ``list2cmdline`` (its ``"`` escaped as ``\\"``),
    so only ``$``, backquote and backslash stay special. A token without one is left bare, so it
    must be plain; braces only without a comma (bash, which is ``sh`` on some distributions,
    expands ``{a,b}``).
    """
    if any(c in _NEVER for c in token):
        return False
    if " " in token or "\t" in token:
        return True
    return set(token) <= _PLAIN and not ("{" in token and "," in token)


class _Argv:
    """Flags in emission order, each value checked for the shell and traced to its field."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.flags: dict[str, str] = {}

    def value(self, flag: str, value: object, source: str) -> None:
        if value is None:
            return
        self._flag(flag, source)
        self.tokens.append(_text(value, source))

    def values(self, flag: str, values: Iterable[object], source: str) -> None:
        items = [_text(v, source) for v in values]
        if items:
            self._flag(flag, source)
            self.tokens.extend(items)

    def switch(self, flag: str, on: bool, source: str) -> None:
        if on:
            self._flag(flag, source)

    def _flag(self, flag: str, source: str) -> None:
        self.flags[flag] = source
        self.tokens.append(flag)


def _text(value: object, source: str) -> str:
    text = repr(value) if isinstance(value, float) else str(value)
    if not survives_ray_entrypoint(text):
        raise ConfigError(
            source,
            f"{text!r} would be altered by /bin/sh when `ray job submit` runs the entrypoint "
            "(values containing a space are quoted and may hold anything but $ ` \\; other "
            'values may only use letters, digits and _@%+=:,./{}-")',
        )
    return text


def custom_config_path(config: RunnerConfig) -> str:
    return f"{config.run.dir.rstrip('/')}/{CUSTOM_CONFIG_FILE}"


def train_command(config: RunnerConfig) -> list[str]:
    """``python3 -u <slime>/train.py <flags>`` (or ``train_async.py``)."""
    script = "train_async.py" if config.slime.async_training else "train.py"
    entry = [
        _text(config.slime.python, "slime.python"),
        "-u",
        _text(f"{config.slime.dir.rstrip('/')}/{script}", "slime.dir"),
    ]
    return [*entry, *train_args(config)]


def train_args(config: RunnerConfig) -> list[str]:
    argv = _Argv()
    _cluster(argv, config)
    _model_and_data(argv, config)
    _rollout(argv, config)
    _training(argv, config)
    _wiring(argv, config)
    return [*argv.tokens, *_extra_args(config, argv)]


def ray_submit_command(config: RunnerConfig) -> list[str]:
    """``ray job submit ... -- <train_command>``; the runtime env carries ``PYTHONPATH``."""
    env = {
        "PYTHONPATH": f"{config.slime.megatron_dir}:{config.slime.dir}",
        **RUNTIME_ENV_DEFAULTS,
        **config.ray.env,
    }
    command = ["ray", "job", "submit", "--address", config.ray.address]
    if config.ray.submission_id:
        command += ["--submission-id", config.ray.submission_id]
    runtime_env: dict[str, object] = {"env_vars": env}
    if config.ray.wheels is not None:
        runtime_env["pip"] = {"packages": _wheels(config.ray.wheels), "pip_check": False}
    command += ["--runtime-env-json", json.dumps(runtime_env, sort_keys=True)]
    if config.ray.no_wait:
        command.append("--no-wait")
    return [*command, "--", *train_command(config)]


def _wheels(directory: str) -> list[str]:
    """The wheels in `directory` (read here, on the machine that submits: the nodes read the
    same path), refused when there are none."""
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".whl"))
    except OSError as error:
        raise ConfigError("ray.wheels", f"cannot list {directory}: {error.strerror}") from None
    if not names:
        raise ConfigError(
            "ray.wheels",
            f"{directory} holds no wheel: build them with "
            "`uv build --all-packages --wheel --out-dir DIR`",
        )
    return [os.path.join(directory, name) for name in names]


def _cluster(argv: _Argv, config: RunnerConfig) -> None:
    c = config.cluster
    argv.value("--actor-num-nodes", c.actor_num_nodes, "cluster.actor_num_nodes")
    argv.value(
        "--actor-num-gpus-per-node", c.actor_num_gpus_per_node, "cluster.actor_num_gpus_per_node"
    )
    argv.value("--rollout-num-gpus", c.rollout_num_gpus, "cluster.rollout_num_gpus")
    argv.value(
        "--rollout-num-gpus-per-engine",
        c.rollout_num_gpus_per_engine,
        "cluster.rollout_num_gpus_per_engine",
    )
    argv.switch("--colocate", c.colocate, "cluster.colocate")
    for name in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        argv.value(_flag_of(name), getattr(c, name), f"cluster.{name}")


def _model_and_data(argv: _Argv, config: RunnerConfig) -> None:
    for name in ("hf_checkpoint", "ref_load", "load", "save", "save_interval"):
        argv.value(_flag_of(name), getattr(config.model, name), f"model.{name}")
    d = config.data
    for name in ("prompt_data", "input_key", "label_key", "metadata_key"):
        argv.value(_flag_of(name), getattr(d, name), f"data.{name}")
    argv.switch("--rollout-shuffle", d.shuffle, "data.shuffle")


def _rollout(argv: _Argv, config: RunnerConfig) -> None:
    r = config.rollout
    argv.value("--num-rollout", r.num_rollout, "rollout.num_rollout")
    argv.value("--rollout-batch-size", r.batch_size, "rollout.batch_size")
    argv.value("--n-samples-per-prompt", r.n_samples_per_prompt, "rollout.n_samples_per_prompt")
    argv.value("--rollout-max-context-len", r.max_context_len, "rollout.max_context_len")
    argv.value("--rollout-max-response-len", r.max_response_len, "rollout.max_response_len")
    argv.value("--rollout-temperature", r.temperature, "rollout.temperature")
    argv.value("--rollout-top-k", None if r.top_k == -1 else r.top_k, "rollout.top_k")
    argv.values("--rollout-stop", r.stop, "rollout.stop")
    argv.values("--rollout-stop-token-ids", r.stop_token_ids, "rollout.stop_token_ids")
    argv.value("--sglang-tool-call-parser", r.tool_call_parser, "rollout.tool_call_parser")
    argv.value("--sglang-reasoning-parser", r.reasoning_parser, "rollout.reasoning_parser")


def _training(argv: _Argv, config: RunnerConfig) -> None:
    t = config.train
    argv.value("--advantage-estimator", t.advantage_estimator, "train.advantage_estimator")
    argv.switch(
        "--disable-rewards-normalization",
        not t.rewards_normalization,
        "train.rewards_normalization",
    )
    argv.switch(
        "--disable-grpo-std-normalization", not t.std_normalization, "train.std_normalization"
    )
    argv.value("--lr", t.lr, "train.lr")
    argv.value("--num-steps-per-rollout", t.num_steps_per_rollout, "train.num_steps_per_rollout")
    argv.switch("--use-dynamic-batch-size", True, "train.max_tokens_per_gpu")
    argv.value("--max-tokens-per-gpu", t.max_tokens_per_gpu, "train.max_tokens_per_gpu")
    argv.value("--eps-clip", t.eps_clip, "train.eps_clip")
    argv.value("--eps-clip-high", t.eps_clip_high, "train.eps_clip_high")
    argv.switch("--use-kl-loss", t.kl_loss_coef > 0, "train.kl_loss_coef")
    argv.value("--kl-loss-coef", t.kl_loss_coef, "train.kl_loss_coef")
    argv.value("--entropy-coef", t.entropy_coef, "train.entropy_coef")


def _wiring(argv: _Argv, config: RunnerConfig) -> None:
    """What makes slime run episodes through this package."""
    argv.value("--custom-generate-function-path", config.episode.generate, "episode.generate")
    argv.value("--custom-reward-post-process-path", REWARD_HOOK, _OURS)
    argv.value("--rollout-sample-filter-path", GATE_HOOK, _OURS)
    argv.value("--custom-config-path", custom_config_path(config), "run.dir")
    argv.value("--router-policy", ROUTER_POLICY, _OURS)
    if config.run.dump_rollouts:
        dump = f"{config.run.dir.rstrip('/')}/rollouts/rollout_{{rollout_id}}.pt"
        argv.value("--save-debug-rollout-data", dump, "run.dir")


def _extra_args(config: RunnerConfig, argv: _Argv) -> list[str]:
    ours = argv.flags
    tokens = list(config.extra_args)
    for index, token in enumerate(tokens):
        source = f"extra_args[{index}]"
        _text(token, source)
        flag = token.partition("=")[0]
        if token.startswith("--") and flag in ours:
            raise ConfigError(source, f"{flag} is already set by {ours[flag]}")
    values = command_values([*argv.tokens, *tokens])
    for flag, problem in refusals({f: value for f, (_, value) in values.items()}):
        index = values[flag][0] - len(argv.tokens) if flag in values else -1
        source = f"extra_args[{index}]" if index >= 0 else ours.get(flag, _OURS)
        raise ConfigError(source, f"{flag} is not supported: {problem}")
    return tokens


def _flag_of(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")
