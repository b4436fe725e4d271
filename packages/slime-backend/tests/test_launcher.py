"""SlimeRunner: TOML -> the exact slime command and its Ray job; bad config -> the field's name."""

from __future__ import annotations

import io
import json
import stat
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import slime_loads_custom_config
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_backend import BackendSettings, ConfigError, from_mapping
from slime_backend.launcher import (
    GATE_HOOK,
    REWARD_HOOK,
    RunnerConfig,
    SlimeRunner,
    survives_ray_entrypoint,
    train_args,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "example-run.toml"
CONTRACT = json.loads(
    (Path(__file__).resolve().parent / "data" / "slime_contract.json").read_text()
)


def example() -> dict[str, Any]:
    return tomllib.loads(EXAMPLE.read_text())


def config_of(data: dict[str, Any]) -> RunnerConfig:
    return from_mapping(RunnerConfig, data)


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2`` -> {"--flag": ["v1", "v2"]} (argparse's reading of our argv)."""
    parsed: dict[str, list[str]] = {}
    current = None
    for token in argv:
        if token.startswith("--"):
            assert token not in parsed, f"{token} emitted twice"
            current = parsed[token] = []
        else:
            assert current is not None, f"{token!r} before any flag"
            current.append(token)
    return parsed


def test_the_example_run_becomes_a_ray_job_running_slime_with_our_hooks(tmp_path: Path) -> None:
    plan = SlimeRunner.from_toml(EXAMPLE).plan()
    submit = list(plan.submit_command)
    assert submit[:5] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8265"]
    separator = submit.index("--")
    assert submit[separator + 1 :] == list(plan.train_command)
    assert plan.train_command[:3] == ("python3", "-u", "/opt/slime/train.py")
    runtime_env = json.loads(submit[submit.index("--runtime-env-json") + 1])
    assert runtime_env == {
        "env_vars": {
            "PYTHONPATH": "/opt/Megatron-LM:/opt/slime",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "NCCL_NVLS_ENABLE": "0",
        }
    }
    flags = flag_values(list(plan.train_command[3:]))
    assert flags["--custom-generate-function-path"] == ["swe_rl.rollout.generate"]
    assert flags["--sglang-tool-call-parser"] == ["qwen25"]
    assert flags["--sglang-reasoning-parser"] == ["qwen3"]
    assert flags["--custom-reward-post-process-path"] == [REWARD_HOOK]
    assert flags["--rollout-sample-filter-path"] == [GATE_HOOK]
    assert flags["--router-policy"] == ["consistent_hashing"]
    assert flags["--custom-config-path"] == ["/mnt/runs/swe-qwen3-8b/agent_rl.yaml"]
    assert flags["--use-dynamic-batch-size"] == []
    assert flags["--max-tokens-per-gpu"] == ["32768"]
    assert flags["--rollout-batch-size"] == ["8"]
    assert flags["--n-samples-per-prompt"] == ["8"]
    assert flags["--lr"] == ["1e-06"]
    assert flags["--use-kl-loss"] == []
    assert flags["--colocate"] == []
    assert flags["--num-layers"] == ["36"]  # extra_args, verbatim, last
    assert plan.train_command[-1] == "--untie-embeddings-and-output-weights"
    assert flags["--save-debug-rollout-data"] == [
        "/mnt/runs/swe-qwen3-8b/rollouts/rollout_{rollout_id}.pt"
    ]


def test_the_custom_config_reaches_slimes_args_intact() -> None:
    runner = SlimeRunner.from_toml(EXAMPLE)
    args = SimpleNamespace(**slime_loads_custom_config(runner.plan().custom_config))
    assert BackendSettings.from_args(args) == runner.config.backend_settings()
    assert args.agent_rl["gates"]["fail_step"] is True


def test_dry_run_prints_a_command_a_shell_gives_back_token_for_token(tmp_path: Path) -> None:
    out = io.StringIO()
    plan = SlimeRunner.from_toml(EXAMPLE).dry_run(out)
    text = out.getvalue()
    assert text.startswith("# 1. write /mnt/runs/swe-qwen3-8b/agent_rl.yaml\n")
    command = text.split("# 2. submit the training job\n")[1]
    echoed = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, check=True
    ).stdout
    assert echoed.decode().split("\0")[:-1] == list(plan.submit_command)


def test_submit_writes_the_custom_config_and_runs_ray_job_submit(tmp_path: Path) -> None:
    """The Ray CLI is replaced by a recorder of its argv (no Ray cluster here)."""
    data = example()
    data["run"]["dir"] = str(tmp_path / "run")
    runner = SlimeRunner(config_of(data))
    recorder = tmp_path / "ray"
    recorder.write_text(
        f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done > {tmp_path / "argv"}\nexit 3\n'
    )
    recorder.chmod(recorder.stat().st_mode | stat.S_IEXEC)
    assert runner.submit(ray=str(recorder)) == 3
    plan = runner.plan()
    assert (tmp_path / "run" / "agent_rl.yaml").read_text() == plan.custom_config
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert argv == list(plan.submit_command[1:])


# -- every flag we emit exists in slime's parser at the pinned commit --------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: object) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        *tables, key = path.split(".")
        target = data
        for table in tables:
            target = target.setdefault(table, {})
        target[key] = value

    return mutate


def _apply(*mutations: Mutation) -> dict[str, Any]:
    data = example()
    for mutate in mutations:
        mutate(data)
    return data


VARIANTS = {
    "example": (),
    "async, separate rollout GPUs": (
        _set("slime.async_training", True),
        _set("cluster.colocate", False),
        _set("cluster.rollout_num_gpus", 8),
        _set("cluster.actor_num_nodes", 2),
    ),
    "resume, stop tokens, no dumps": (
        _set("model.load", "/ckpt/in"),
        _set("rollout.stop_token_ids", [151645, 151643]),
        _set("rollout.top_k", 20),
        _set("rollout.stop", ["END_OF_PATCH", "DONE"]),
        _set("run.dump_rollouts", False),
        _set("data.label_key", None),
        _set("data.shuffle", False),
    ),
    "Dr. GRPO, no KL": (_set("train.std_normalization", False), _set("train.kl_loss_coef", 0.0)),
    "no reasoning parser": (_set("rollout.reasoning_parser", None),),
    "raw rewards": (
        _set("train.rewards_normalization", False),
        _set("train.advantage_estimator", "reinforce_plus_plus"),
        _set("rollout.n_samples_per_prompt", 1),
    ),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_flag_we_emit_is_one_slime_parses(name: str) -> None:
    data = _apply(*VARIANTS[name], _set("extra_args", []))
    emitted = [t for t in train_args(config_of(data)) if t.startswith("--")]
    known = set(CONTRACT["flags"]) | set(CONTRACT["mounted"])
    assert emitted
    assert [f for f in emitted if f not in known] == []


def test_the_variants_cover_every_flag_the_launcher_can_emit() -> None:
    emitted: set[str] = set()
    for mutations in VARIANTS.values():
        data = _apply(*mutations, _set("extra_args", []))
        emitted |= {t for t in train_args(config_of(data)) if t.startswith("--")}
    switches = {
        "--colocate",
        "--rollout-shuffle",
        "--use-kl-loss",
        "--disable-grpo-std-normalization",
        "--disable-rewards-normalization",
        "--save-debug-rollout-data",
        "--load",
        "--rollout-num-gpus",
        "--rollout-stop-token-ids",
        "--rollout-top-k",
        "--rollout-stop",
        "--label-key",
    }
    assert switches <= emitted


def test_mounted_flags_say_where_slime_gets_them() -> None:
    for flag, entry in CONTRACT["mounted"].items():
        assert entry["from"], flag
        assert entry["evidence"], flag
    assert CONTRACT["slime_commit"].startswith("624b824a")


# -- bad configuration: one error naming the field -------------------------------------------

BAD = [
    (_set("rollout.n_samples_per_prompt", 1), r"rollout\.n_samples_per_prompt: grpo compares"),
    (_set("rollout.n_samples_per_prompt", "8"), r"rollout\.n_samples_per_prompt: expected an int"),
    (_set("rollout.batch_size", True), r"rollout\.batch_size: expected an integer, got bool"),
    (_set("rollout.batchsize", 8), r"rollout\.batchsize: unknown setting; known: batch_size"),
    (_set("rollout.max_response_len", 65536), r"rollout\.max_response_len: must be below"),
    (_set("rollout.top_k", 0), r"rollout\.top_k: must be -1 \(off\) or positive, got 0"),
    (_set("rollout.stop", ["DONE", ""]), r"rollout\.stop: stop strings must not be empty"),
    (_set("rollout.stop", ["</answer>"]), r"rollout\.stop: '</answer>' would be altered"),
    (_set("train.advantage_estimator", "dapo"), r"train\.advantage_estimator: expected one of"),
    (_set("train.num_steps_per_rollout", 3), r"train\.num_steps_per_rollout: must divide the 64"),
    (_set("train.lr", 0), r"train\.lr: must be positive"),
    (_set("model.hf_checkpoint", "models/x"), r"model\.hf_checkpoint: must be an absolute path"),
    (_set("model.save", None), r"model\.save_interval: needs model\.save"),
    (_set("slime.async_training", True), r"slime\.async_training: slime's train_async\.py refuses"),
    (_set("cluster.colocate", False), r"cluster\.rollout_num_gpus: required when colocate"),
    (_set("cluster.tensor_model_parallel_size", 3), r"cluster\.tensor_model_parallel_size: .* 8"),
    (_set("cluster.rollout_num_gpus_per_engine", 3), r"cluster\.rollout_num_gpus_per_engine:"),
    (_set("ray.env", {"PYTHONPATH": "/x"}), r"ray\.env: PYTHONPATH is set from slime\.dir"),
    (_set("ray.env", {"A": 1}), r"ray\.env\.A: expected a string, got int 1"),
    (_set("episode.generate", "run"), r"episode\.generate: expected a dotted path"),
    (_set("episode.grace_s", 0), r"episode\.grace_s: must be a positive number"),
    (_set("rollout.tool_call_parser", "kimi_k2"), r"rollout\.tool_call_parser: 'kimi_k2' is not"),
    (_set("rollout.reasoning_parser", "kimi"), r"rollout\.reasoning_parser: 'kimi' is not"),
    (_set("conversion.staleness.action", "drop"), r"conversion\.staleness\.action: expected"),
    (
        _set("conversion.staleness.max_version_span", -1),
        r"conversion\.staleness\.max_version_span: must be 0 or more",
    ),
    (_set("adapter.port", 70000), r"adapter\.port: must be a TCP port"),
    (_set("workers.mode", "slurm"), r"workers\.mode: expected one of 'local', 'ray'"),
    (_set("workers.max_episodes_per_worker", 0), r"workers\.max_episodes_per_worker: must be"),
    (_set("conversion.reward_policy", "split"), r"conversion\.reward_policy: 'split' is not"),
    (_set("gates.max_zero_trainable_share", 2), r"gates\.max_zero_trainable_share: must be a"),
    (lambda d: d.pop("episode"), r"^[^:]+: episode: required setting is missing"),
    (_set("extra_args", ["--lr", "1e-5"]), r"extra_args\[0\]: --lr is already set by train\.lr"),
    (
        _set("extra_args", ["--custom-generate-function-path=x.y"]),
        r"extra_args\[0\]: --custom-generate-function-path is already set by episode\.generate",
    ),
    (_set("extra_args", ["--group-rm"]), r"extra_args\[0\]: --group-rm is not supported"),
    (_set("extra_args", ["--rollout-top-p", "0.9"]), r"extra_args\[0\]: --rollout-top-p is not"),
    (_set("extra_args", ["--moe-layer-freq", "[1,1]"]), r"extra_args\[1\]: '\[1,1\]' would be"),
    (_set("data.prompt_data", "/data/$USER/a.jsonl"), r"data\.prompt_data: .* altered by /bin/sh"),
    (_set("slime.dir", "/opt/sl;ime"), r"slime\.dir: .* altered by /bin/sh"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD)
def test_bad_config_is_one_error_naming_the_field(
    tmp_path: Path, mutate: Mutation, message: str
) -> None:
    data = example()
    mutate(data)
    path = tmp_path / "run.toml"
    path.write_text(_to_toml(data))
    with pytest.raises(ConfigError, match=message) as raised:
        SlimeRunner.from_toml(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_a_run_file_turns_the_reasoning_parser_off_with_none() -> None:
    data = _apply(_set("rollout.reasoning_parser", "none"))
    config = config_of(data)
    assert config.rollout.reasoning_parser is None
    assert "--sglang-reasoning-parser" not in train_args(config)


def test_top_k_and_stop_strings_become_slimes_rollout_flags() -> None:
    default = flag_values(train_args(config_of(_apply(_set("extra_args", [])))))
    assert "--rollout-top-k" not in default  # -1, slime's own default: nothing to say
    assert "--rollout-stop" not in default
    data = _apply(_set("rollout.top_k", 20), _set("rollout.stop", ["END_OF_PATCH", "DONE"]))
    flags = flag_values(train_args(config_of(data)))
    assert flags["--rollout-top-k"] == ["20"]
    assert flags["--rollout-stop"] == ["END_OF_PATCH", "DONE"]  # nargs="+" in slime's parser


def test_top_p_one_is_allowed_through() -> None:
    data = _apply(_set("extra_args", ["--rollout-top-p=1.0"]))
    assert train_args(config_of(data))[-1] == "--rollout-top-p=1.0"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[rollout\n")
    with pytest.raises(ConfigError, match=rf"^{path}: not valid TOML"):
        SlimeRunner.from_toml(path)


def _to_toml(data: dict[str, Any]) -> str:
    """Enough TOML for these tests' mutations (tables of scalars, lists and inline tables)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for table, values in data.items():
        if isinstance(values, dict):
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None)
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def test_the_toml_writer_used_above_round_trips_the_example() -> None:
    assert tomllib.loads(_to_toml(example())) == example()


# -- values survive `ray job submit` ---------------------------------------------------------


SHELL_ALPHABET = st.one_of(
    st.sampled_from(list("aZ09_@%+=:,./{}-\"' \t\n$`\\;&|<>()*?[]~#!")),
    st.characters(codec="utf-8", exclude_characters="\0"),
)


def through_ray_entrypoint(tokens: list[str], shell: str) -> list[str]:
    """What the job's ``sh -c`` passes on after ``ray job submit`` joined ``tokens``
    (``subprocess.list2cmdline``, exactly as Ray's CLI does)."""
    script = "printf '%s\\0' " + subprocess.list2cmdline(tokens)
    out = subprocess.run([shell, "-c", script], capture_output=True, check=False, cwd="/").stdout
    return out.decode().split("\0")[:-1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=SHELL_ALPHABET), max_size=12))
@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_accepted_values_reach_slime_unchanged(shell: str, tokens: list[str]) -> None:
    accepted = [t for t in tokens if survives_ray_entrypoint(t)]
    assert through_ray_entrypoint(["x", *accepted], shell)[1:] == accepted


@pytest.mark.parametrize(
    "token", ["$HOME", "a b $X", "*", "a;b", "{a,b}", "`id`", "a\\\\ b", "~", "[1,1]"]
)
def test_refused_values_would_have_been_altered(token: str) -> None:
    assert not survives_ray_entrypoint(token)
    if token != "[1,1]":  # a glob only changes when a matching file exists
        assert through_ray_entrypoint(["x", token], "bash")[1:] != [token]


def test_the_readme_shows_the_real_dry_run() -> None:
    out = io.StringIO()
    SlimeRunner.from_toml(EXAMPLE).dry_run(out)
    readme = (EXAMPLE.parent.parent / "README.md").read_text()
    shown = readme.split("The dry run of the example:\n\n```text\n")[1].split("```")[0]
    assert shown == out.getvalue()


def test_the_generate_path_defaults_to_what_the_app_gives(tmp_path: Path) -> None:
    data = example()
    del data["episode"]["generate"]
    path = tmp_path / "run.toml"
    path.write_text(_to_toml(data))
    runner = SlimeRunner.from_toml(path, generate_function="my_app.rollout.generate")
    flags = flag_values(list(runner.plan().train_command[3:]))
    assert flags["--custom-generate-function-path"] == ["my_app.rollout.generate"]
    with pytest.raises(ConfigError, match=r"episode\.generate: required setting is missing"):
        SlimeRunner.from_toml(path)
    explicit = SlimeRunner.from_toml(EXAMPLE, generate_function="my_app.rollout.generate")
    assert explicit.config.episode.generate == "swe_rl.rollout.generate"
