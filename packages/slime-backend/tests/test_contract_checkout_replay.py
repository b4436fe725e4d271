"""Opt-in: real slime's ``Sample`` and routing-replay check accept our ``rollout_routed_experts``.

    AGENT_RL_SLIME_CHECKOUT=/path/to/slime uv run pytest packages/slime-backend -m slime_checkout

Needs torch besides the checkout (slime's modules import it): skipped without either. The
checkout's ``slime`` package (a work tree's, or a bare repository's HEAD unpacked) is imported in
a child process, which converts episodes with ``slime.utils.types.Sample`` and routing replay on,
then runs what slime's rollout manager does with a batch: ``torch.as_tensor`` on every sample's
routing and ``validate_rollout_routed_experts_for_replay``.
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

CHECKOUT = os.environ.get("AGENT_RL_SLIME_CHECKOUT")
TESTS = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.slime_checkout,
    pytest.mark.skipif(not CHECKOUT, reason="set AGENT_RL_SLIME_CHECKOUT to a slime checkout"),
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="slime's modules need torch"
    ),
]

SCRIPT = """
from types import SimpleNamespace

import torch
from episode_kit import Recorder, base_sample, system, tool, user
from slime.observability.rollout_data_utils import validate_rollout_routed_experts_for_replay
from slime.utils.types import Sample

from slime_backend import ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend._routing_replay import RoutingReplay

LAYERS, TOPK = 4, 2
args = SimpleNamespace(num_layers=LAYERS, moe_router_topk=TOPK, moe_layer_freq=None)


def episode(index, routed):
    recorder = Recorder(seed=index)
    messages = [system("main agent"), user("fix the bug")]
    for step in range(3):
        routing = (LAYERS, TOPK) if routed else None
        reply = recorder.turn(messages, f"step {step}", calls=1, routing=routing)
        messages = [*messages, reply, tool(f"call-{step}-0", f"out {step}")]
    return episode_samples(
        recorder.tree,
        base_sample(index=index),
        EpisodeOutcome(1.0),
        ConversionOptions(max_sample_tokens=60 if index == 1 else None),
        sample_class=Sample,
        replay=RoutingReplay(LAYERS, TOPK),
    )


batch = [s for i, routed in enumerate([True, True, False]) for s in episode(i, routed)]
assert [s.status for s in batch] == [
    Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED
]
routed = [torch.as_tensor(s.rollout_routed_experts) for s in batch]  # as slime's rollout does
assert [tuple(r.shape) for r in routed] == [(len(s.tokens) - 1, LAYERS, TOPK) for s in batch]
validate_rollout_routed_experts_for_replay(routed, args)
print("accepted", [tuple(r.shape) for r in routed])
"""


def slime_source(checkout: Path, where: Path) -> Path:
    """The directory holding the checkout's ``slime`` package."""
    if (checkout / "slime" / "__init__.py").is_file():
        return checkout
    archive = subprocess.run(
        ["git", "--git-dir", str(checkout), "archive", "--format=tar", "HEAD", "slime"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where


def test_real_slime_accepts_our_routing_for_replay(tmp_path: Path) -> None:
    assert CHECKOUT
    source = slime_source(Path(CHECKOUT), tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("accepted [")
