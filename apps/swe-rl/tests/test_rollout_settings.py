"""Rollout settings: defaults, the checkpoint's, a file's, the flags', each value's source, every
bad value refused by name, and the same settings as a training run file."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from protocol_adapters import TemplateMode, Vocabulary, qwen3_template
from protocol_adapters.testing.checkpoint import write_checkpoint
from slime_backend import FieldError, to_mapping
from slime_backend.launcher import SlimeRunner, train_args
from swe_rl.cli import build_parser, main
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.errors import UsageError
from swe_rl.rollout_flags import SETTINGS, TEMPLATE_MODES
from swe_rl.rollout_settings import (
    FIELDS,
    RUN_FILE,
    SLIME_FLAGS,
    ResolvedSettings,
    RolloutSettings,
    resolve_settings,
    settings_from_args,
)

APP = Path(__file__).resolve().parents[1]
EXAMPLE = APP / "docs" / "example-settings.toml"
SLIME_BACKEND = APP.parents[1] / "packages" / "slime-backend"
EXAMPLE_RUN = SLIME_BACKEND / "docs" / "example-run.toml"
CONTRACT = json.loads((SLIME_BACKEND / "tests" / "data" / "slime_contract.json").read_text())
QWEN3 = qwen3_template().source
QWEN3_GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [151645]}


def checkpoint(tmp_path: Path, generation: dict[str, Any] | None = None) -> Path:
    """A checkpoint directory: only its generation_config.json is read here."""
    directory = tmp_path / "ckpt"
    directory.mkdir(exist_ok=True)
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def rollout_args(*extra: str) -> list[str]:
    return ["rollout", "t.jsonl", "--engine-url", "http://e:1", "--checkpoint", "c", "--out", "o"]


def test_the_example_file_is_every_setting_and_loads(tmp_path: Path) -> None:
    data = tomllib.loads(EXAMPLE.read_text())
    assert set(data) | {"rollout_max_context_len"} == set(FIELDS)  # the context: commented out
    resolved = resolve_settings(checkpoint(tmp_path, QWEN3_GENERATION), QWEN3, file=EXAMPLE)
    assert {name for name, source in resolved.sources.items() if source == "file"} == set(data)
    assert resolved.sources["rollout_max_context_len"] == "default"
    settings = resolved.settings
    assert settings.rollout_temperature == 1.0  # the file's, over the checkpoint's 0.6
    assert settings.max_episode_new_tokens == 400000
    assert settings.template_mode is TemplateMode.EXACT
    assert settings.rollout_stop == ()


def test_each_value_comes_from_the_last_place_that_sets_it(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path, {**QWEN3_GENERATION, "min_p": 0.0})
    file = tmp_path / "settings.toml"
    file.write_text('rollout_top_p = 0.9\nrollout_stop = ["</done>"]\nmax_turns = 50\n')
    words = [*rollout_args(), "--settings", str(file), "--max-turns", "30"]
    words += ["--sglang-reasoning-parser", "none", "--max-episode-new-tokens", "5000"]
    words += ["--template-mode", "full-render", "--rollout-stop", "END", "--budget", "600"]
    args = build_parser().parse_args(words)
    resolved = settings_from_args(args, ckpt, QWEN3)
    settings, sources = resolved.settings, resolved.sources
    assert (settings.rollout_temperature, sources["rollout_temperature"]) == (0.6, "checkpoint")
    assert resolved.notes["rollout_temperature"] == "generation_config.json temperature"
    assert (settings.rollout_top_k, sources["rollout_top_k"]) == (20, "checkpoint")
    assert (settings.rollout_top_p, sources["rollout_top_p"]) == (0.9, "file")
    assert (settings.max_turns, sources["max_turns"]) == (30, "flag")
    assert (settings.rollout_stop, sources["rollout_stop"]) == (("END",), "flag")
    assert (settings.wall_clock_s, sources["wall_clock_s"]) == (600.0, "flag")
    assert (settings.sglang_reasoning_parser, sources["sglang_reasoning_parser"]) == (None, "flag")
    assert settings.template_mode is TemplateMode.FULL_RENDER
    assert (settings.max_episode_new_tokens, settings.rollout_max_response_len) == (5000, 32768)
    assert sources["rollout_max_response_len"] == "default"
    assert (settings.sglang_tool_call_parser, sources["sglang_tool_call_parser"]) == (
        "qwen25",
        "checkpoint",
    )
    resolved = resolved.with_engine_context(40960)
    assert (resolved.context, resolved.sources["rollout_max_context_len"]) == (40960, "engine")
    record = resolved.record()
    assert list(record) == list(FIELDS)
    assert record["rollout_stop"] == {"value": ["END"], "source": "flag"}
    assert record["template_mode"] == {"value": "full-render", "source": "flag"}
    assert record["rollout_temperature"]["note"] == "generation_config.json temperature"
    json.dumps(record)  # run.json holds it


def test_the_checkpoint_states_the_reply_parsers_by_its_templates_markup(tmp_path: Path) -> None:
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    resolved = resolve_settings(checkpoint(tmp_path), plain)
    assert resolved.settings.sglang_tool_call_parser == "qwen25"  # nothing stated: the default
    assert resolved.sources["sglang_tool_call_parser"] == "default"
    assert resolved.settings.sglang_reasoning_parser is None  # no <think> in the template
    coder = "<tool_call>\n<function={{ name }}>\n<parameter=x>" + "<think>"
    resolved = resolve_settings(checkpoint(tmp_path), coder)
    assert resolved.settings.sglang_tool_call_parser == "qwen3_coder"
    assert resolved.settings.sglang_reasoning_parser == "qwen3"
    assert resolved.notes["sglang_tool_call_parser"].startswith("chat template: Qwen3-Coder")
    # Hugging Face's top_k = 0 is no cut: -1 here.
    assert resolve_settings(checkpoint(tmp_path, {"top_k": 0}), QWEN3).settings.rollout_top_k == -1


@pytest.mark.parametrize(
    ("words", "file", "generation", "message"),
    [
        (
            ["--rollout-temperature", "-1"],
            None,
            None,
            "rollout_temperature: must be a positive number, got -1.0 (from --rollout-temperature)",
        ),
        (
            ["--rollout-top-p", "1.5"],
            None,
            None,
            "rollout_top_p: must be in (0, 1], got 1.5 (from --rollout-top-p)",
        ),
        (["--max-turns", "0"], None, None, "max_turns: must be at least 1, got 0"),
        (["--rollout-stop", ""], None, None, "rollout_stop: stop strings must not be empty"),
        (
            ["--sglang-tool-call-parser", "kimi_k2"],
            None,
            None,
            "sglang_tool_call_parser: 'kimi_k2' is not a tool-call format the adapters parse",
        ),
        ([], "temprature = 0.6\n", None, "temprature: unknown setting; known: max_episode_new"),
        ([], 'rollout_top_k = "20"\n', None, "rollout_top_k: expected an integer, got str '20'"),
        ([], "min_p = 2.0\n", None, "min_p: must be in [0, 1], got 2.0 (from "),
        ([], 'template_mode = "loose"\n', None, "template_mode: expected one of 'exact'"),
        ([], "rollout_temperature = \n", None, "not a TOML file"),
        (
            [],
            None,
            {"temperature": 0.0},
            "rollout_temperature: must be a positive number, got 0.0 (from the checkpoint's "
            "generation_config.json temperature); set it with --settings FILE or "
            "--rollout-temperature",
        ),
    ],
)
def test_a_bad_value_is_refused_by_name_with_where_it_came_from(
    tmp_path: Path,
    words: list[str],
    file: str | None,
    generation: dict[str, Any] | None,
    message: str,
) -> None:
    ckpt = checkpoint(tmp_path, generation)
    if file is not None:
        (tmp_path / "s.toml").write_text(file)
        words = [*words, "--settings", str(tmp_path / "s.toml")]
    args = build_parser().parse_args([*rollout_args(), *words])
    with pytest.raises(UsageError) as refused:
        settings_from_args(args, ckpt, QWEN3)
    assert message in str(refused.value)


def test_rollout_refuses_a_bad_setting_in_one_line_before_any_episode(
    qwen_vocabulary: Vocabulary, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", qwen_vocabulary)
    (tmp_path / "tasks.jsonl").write_text(json.dumps(create_demo_tasks(tmp_path / "repos")[0]))
    words = ["rollout", str(tmp_path / "tasks.jsonl"), "--engine-url", "http://127.0.0.1:9"]
    words += ["--checkpoint", str(ckpt), "--out", str(tmp_path / "run")]
    assert main([*words, "--rollout-top-k", "0"]) == 2
    err = capsys.readouterr().err
    assert "rollout_top_k: must be -1 (off) or positive, got 0 (from --rollout-top-k)" in err
    assert main([*words, "--rollout-top-k", "many"]) == 2
    assert "argument --rollout-top-k: invalid int value: 'many'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_context_larger_than_the_engines_is_refused_by_name(tmp_path: Path) -> None:
    args = build_parser().parse_args([*rollout_args(), "--context-tokens", "65536"])
    resolved = settings_from_args(args, checkpoint(tmp_path), QWEN3)
    assert resolved.sources["rollout_max_context_len"] == "flag"
    with pytest.raises(UsageError, match=r"rollout_max_context_len: 65536 \(from flag\) is larger"):
        resolved.with_engine_context(32768)
    assert resolved.with_engine_context(65536).context == 65536


def test_the_table_shows_every_value_and_its_source(tmp_path: Path) -> None:
    from rich.console import Console

    resolved = resolve_settings(checkpoint(tmp_path, QWEN3_GENERATION), QWEN3)
    console = Console(record=True, width=200)
    console.print(resolved.with_engine_context(32768).table())
    text = console.export_text()
    for name in FIELDS:
        assert name in text
    assert "checkpoint (generation_config.json temperature)" in text
    assert "--rollout-temperature" in text


def test_the_flags_and_the_settings_are_the_same_list() -> None:
    assert SETTINGS == FIELDS
    assert tuple(mode.value for mode in TemplateMode) == TEMPLATE_MODES
    args = build_parser().parse_args(rollout_args())
    assert all(getattr(args, name) is None for name in FIELDS)  # nothing set: nothing overrides


def test_settings_slime_has_keep_slimes_names_and_flags() -> None:
    flags = set(CONTRACT["flags"]) | set(CONTRACT["mounted"])  # sglang's: mounted by slime
    for name, flag in SLIME_FLAGS.items():
        assert flag in flags, flag
        assert name in FIELDS
    assert set(RUN_FILE) == set(FIELDS)


def test_the_settings_are_a_training_run_files_rollout_episode_and_adapter(
    tmp_path: Path,
) -> None:
    """Each setting a run file can hold lands where RUN_FILE says, and slime gets it as the flag
    of the same name."""
    settings = RolloutSettings(
        rollout_temperature=0.8,
        rollout_top_k=40,
        rollout_max_response_len=16384,
        max_episode_new_tokens=200000,
        rollout_max_context_len=65536,
        rollout_stop=("END_OF_PATCH",),
        max_turns=120,
        wall_clock_s=900.0,
        sglang_tool_call_parser="qwen3_coder",
        sglang_reasoning_parser=None,
        template_mode=TemplateMode.ACCEPT_DEVIATIONS,
    )
    run = tomllib.loads(EXAMPLE_RUN.read_text())
    for table, tables in settings.run_file_tables().items():
        run[table] = {**run.get(table, {}), **tables}
    path = tmp_path / "run.toml"
    path.write_text(_toml(run))
    config = SlimeRunner.from_toml(path).config
    values: Any = to_mapping(settings)
    for name, where in RUN_FILE.items():
        if where is None:
            continue
        table, key = where.split(".")
        value = to_mapping(getattr(getattr(config, table), key))
        assert value == values[name], name
    argv = train_args(config)
    for name, flag in SLIME_FLAGS.items():
        if name == "rollout_top_p":
            assert flag not in argv  # slime's default, 1: nothing to say
            continue
        if values[name] is None:
            assert flag not in argv
            continue
        given = values[name] if isinstance(values[name], list) else [values[name]]
        at = argv.index(flag)
        assert argv[at + 1 : at + 1 + len(given)] == [str(v) for v in given], flag
    backend = config.backend_settings()
    assert backend.episode.max_episode_new_tokens == 200000
    assert backend.adapter.template_mode is TemplateMode.ACCEPT_DEVIATIONS


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rollout_top_p": 0.95}, "rollout_top_p: 0.95 has no training run"),
        ({"min_p": 0.05}, "min_p: 0.05 has no training run"),
        ({"rollout_max_context_len": None}, "rollout_max_context_len: a training run states it"),
    ],
)
def test_what_a_training_run_cannot_have_is_refused_by_name(
    change: dict[str, Any], message: str
) -> None:
    settings = dataclasses.replace(RolloutSettings(rollout_max_context_len=4096), **change)
    with pytest.raises(FieldError, match=message):
        settings.run_file_tables()


def test_the_resolved_context_is_what_slime_args_get(tmp_path: Path) -> None:
    resolved = ResolvedSettings(
        RolloutSettings(rollout_stop=("X",)), dict.fromkeys(FIELDS, "default")
    )
    with pytest.raises(RuntimeError, match="resolved against the engine"):
        _ = resolved.context
    resolved = resolved.with_engine_context(8192)
    overrides = resolved.settings.slime_overrides(resolved.context)
    assert overrides["rollout_max_context_len"] == 8192
    assert overrides["rollout_stop"] == ["X"]
    assert "rollout_top_p" not in overrides  # slime's args: only 1 (no top-p replay)
    params = resolved.settings.sampling_params()
    assert params["stop"] == ["X"]
    assert "min_p" not in params  # slime's dict has no min_p: only a set one is added
    assert "custom_params" not in params


def _toml(data: dict[str, Any]) -> str:
    """A minimal TOML writer for the run file (tables of scalars and lists, top-level lists)."""
    lines = [
        f"{key} = {json.dumps(value)}" for key, value in data.items() if isinstance(value, list)
    ]
    for table, values in data.items():
        if not isinstance(values, dict):
            continue
        lines.append(f"[{table}]")
        for key, value in values.items():
            if isinstance(value, dict):
                inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inline} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"
