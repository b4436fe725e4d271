"""slime's real rollout function, run without a GPU: the code our hooks live in, as it is.

slime's rollout modules are read from the slime checkout ``AGENT_RL_SLIME_CHECKOUT`` names (a
work tree or a bare git directory; slime is not on PyPI and nothing of it is copied into this
repository), each checked against the SHA-256 ``tools/slime_contract.py`` pinned for the pinned
commit:
``slime.rollout.sglang_rollout`` (``generate_rollout``, ``generate_rollout_async``,
``generate_and_rm_group``, ``generate_and_rm``, ``abort``), ``slime.rollout.base_types``,
``slime.rollout.filter_hub.base_types`` (``DynamicFilterOutput``, ``call_dynamic_filter``),
``slime.rollout.filter_hub.dynamic_sampling_filters``, ``slime.rollout.sample_hooks`` and
``slime.utils.async_utils`` (the daemon thread whose event loop runs every generate call).

:class:`SlimeRollout` loads them as the ``slime`` package for the duration of a test, beside
stand-ins for what needs a GPU stack or a cluster, each doing what slime's does on the path a
custom generate function takes:

- ``slime.utils.types.Sample``: :class:`~slime_backend.testing.StandInSample`;
- ``slime.utils.misc``: ``load_function`` (cached import of ``module.attribute``) and
  ``SingletonMeta``, as slime's (the real module imports torch);
- ``slime.utils.http_utils``: the router's ``/workers`` answers no workers (``abort`` then has
  nothing to abort), one rollout engine; ``post`` is slime's own generate, never called here;
- ``slime.rollout.rm_hub``: slime's ``batched_async_rm`` over ``async_rm``, which, as slime's
  without ``--rm-type``, raises: our samples carry their rewards, so it is never reached;
- tokenizer and processor loading return None (only slime's own generate uses them);
- tracing is a no-op; ``numpy``, ``tqdm`` and ``torch`` are the real ones where installed, else
  the little of them these modules touch (``torch`` only for ``dynamic_sampling_filters``'
  import).

The data source is slime's ``RolloutDataSource.get_samples``: each prompt copied
``n_samples_per_prompt`` times with a group index per prompt and an index per sample
(:class:`TaskSource`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

from rollout_kit import scripted_episode

from slime_backend import BackendSettings
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args

DATA = Path(__file__).resolve().parent / "data"
CONTRACT = json.loads((DATA / "slime_contract.json").read_text())
CHECKOUT = os.environ.get("AGENT_RL_SLIME_CHECKOUT")
"""A slime checkout at the pinned commit; the tests that run slime's code skip without one."""
REAL_MODULES = (
    "slime.utils.async_utils",
    "slime.rollout.filter_hub.base_types",
    "slime.rollout.base_types",
    "slime.rollout.sample_hooks",
    "slime.rollout.sglang_rollout",
)
"""Loaded in this order (each imports the earlier ones)."""
FILTERS = "slime.rollout.filter_hub.dynamic_sampling_filters"

APP_MODULE = "app_rollout"
GENERATE_PATH = f"{APP_MODULE}.generate"
"""The app's module attribute slime loads (``--custom-generate-function-path``): a module
:class:`SlimeRollout` installs with a fresh generate function (one process, one run)."""


def slime_source(module: str) -> tuple[str, str]:
    """(path in the checkout, text) of a slime module, refused unless it is the pinned one."""
    assert CHECKOUT, "set AGENT_RL_SLIME_CHECKOUT to a slime checkout"
    name = module.replace(".", "/") + ".py"
    where = Path(CHECKOUT)
    if (where / "train.py").is_file():
        text = (where / name).read_text()
    else:
        text = subprocess.run(
            ["git", "--git-dir", str(where), "show", f"HEAD:{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    digest = hashlib.sha256(text.encode()).hexdigest()
    pinned = CONTRACT["rollout_sources"][name]
    assert digest == pinned, f"{name} in {CHECKOUT} is not the pinned one (move the pin)"
    return str(where / name), text


def rollout_args(
    router_url: str, checkpoint: Path, settings: BackendSettings, **overrides: object
) -> SimpleNamespace:
    """slime's ``args`` for its default rollout: what our generate function reads
    (:func:`slime_backend.testing.slime_args`, our hooks wired in) plus the fields slime's
    rollout reads, at slime's defaults (the checked flags' defaults are pinned in the contract
    data)."""
    defaults = {entry["dest"]: entry["default"] for entry in CONTRACT["flag_defaults"].values()}
    base = slime_args(router_url, checkpoint, settings)
    values: dict[str, object] = {
        **defaults,
        **vars(base),
        "custom_generate_function_path": GENERATE_PATH,
        "rollout_global_dataset": True,
        "over_sampling_batch_size": base.rollout_batch_size,
        "mask_offpolicy_in_partial_rollout": False,
        "ci_test": False,
        "sglang_server_concurrency": 512,
        "sglang_dp_size": None,
        "rollout_top_k": -1,
        "rollout_stop": None,
        "rollout_stop_token_ids": None,
        "rollout_skip_special_tokens": False,
        "rollout_seed": 42,
        "use_rollout_routing_replay": False,
        "custom_rm_path": None,
        "rm_type": None,
        "rollout_sample_hook_path": [],
        **overrides,
    }
    return SimpleNamespace(**values)


class TaskSource:
    """slime's ``RolloutDataSource.get_samples`` over prompts given by their copies' task
    payloads: prompt ``k`` is ``payloads[k % len(payloads)]``, its copy ``j`` gets payload
    ``j % n`` of it (slime's copies are identical; a payload steers its scripted episode, so a
    group can mix outcomes)."""

    def __init__(self, args: Any, payloads: Sequence[Sequence[Mapping[str, Any]]]) -> None:
        self.args = args
        self.payloads = [list(p) for p in payloads]
        self.offset = self.group_index = self.index = 0

    def get_samples(self, num_samples: int) -> list[list[StandInSample]]:
        groups = []
        for _ in range(num_samples):
            copies = self.payloads[self.offset % len(self.payloads)]
            self.offset += 1
            prompt = StandInSample(prompt="Fix the bug.", label="x")
            group = []
            for j in range(self.args.n_samples_per_prompt):
                sample = copy.deepcopy(prompt)
                sample.metadata = dict(copies[j % len(copies)])
                sample.group_index = self.group_index
                sample.index = self.index
                self.index += 1
                group.append(sample)
            self.group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[StandInSample]]) -> None:
        raise RuntimeError("Cannot add samples to RolloutDataSource. This is a read-only source.")


class SlimeRollout:
    """slime's rollout modules installed as ``slime``; :meth:`close` restores ``sys.modules``."""

    def __init__(self) -> None:
        self.generate = make_generate(scripted_episode, sample_class=StandInSample)
        self._saved: dict[str, ModuleType | None] = {}
        self.modules: dict[str, ModuleType] = {}
        self._install(APP_MODULE, _module(APP_MODULE, generate=self.generate))
        for name, module in _stand_ins().items():
            self._install(name, module)
        for name in REAL_MODULES:
            self._load(name)

    def __getitem__(self, name: str) -> ModuleType:
        return self.modules[name]

    def generate_rollout(self, args: Any, rollout_id: int, source: TaskSource) -> Any:
        """slime's ``generate_rollout(args, rollout_id, data_source)`` for a training step: it
        blocks until slime's loop thread has run the whole rollout (call it from a thread)."""
        return self["slime.rollout.sglang_rollout"].generate_rollout(args, rollout_id, source)

    def load_filters(self) -> ModuleType:
        """slime's own dynamic-sampling filters (they import torch: a stand-in where absent)."""
        if importlib.util.find_spec("torch") is None:
            self._install("torch", ModuleType("torch"))
        return self._load(FILTERS)

    def close(self) -> None:
        """Stop the generate function and slime's loop thread, then unload slime."""
        loop_thread = self["slime.utils.async_utils"].async_loop
        if loop_thread is not None:
            with contextlib.suppress(Exception):
                loop_thread.run(self.generate.aclose())
            loop_thread.loop.call_soon_threadsafe(loop_thread.loop.stop)
            loop_thread._thread.join(timeout=10)
        for name, previous in self._saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous

    def _install(self, name: str, module: ModuleType) -> None:
        self._saved.setdefault(name, sys.modules.get(name))
        sys.modules[name] = module
        self.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in self.modules:
            setattr(self.modules[parent], child, module)

    def _load(self, name: str) -> ModuleType:
        path, text = slime_source(name)
        spec = importlib.util.spec_from_loader(name, loader=None, origin=path)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__file__ = path
        module.__package__ = name.rpartition(".")[0]
        self._install(name, module)
        exec(compile(text, path, "exec"), module.__dict__)
        return module


@contextlib.contextmanager
def slime_rollout() -> Iterator[SlimeRollout]:
    rollout = SlimeRollout()
    try:
        yield rollout
    finally:
        rollout.close()


# -- stand-ins ---------------------------------------------------------------------------------


def _package(name: str) -> ModuleType:
    module = ModuleType(name)
    module.__path__ = []
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module


def _module(name: str, **attributes: Any) -> ModuleType:
    module = ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def _misc() -> ModuleType:
    """slime's ``load_function`` (cached per process) and ``SingletonMeta``, fresh per rollout."""

    @functools.cache
    def load_function(path: str) -> Any:
        module_path, _, attribute = path.rpartition(".")
        return getattr(importlib.import_module(module_path), attribute)

    class SingletonMeta(type):
        _instances: ClassVar[dict[type, Any]] = {}

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls not in cls._instances:
                cls._instances[cls] = super().__call__(*args, **kwargs)
            return cls._instances[cls]

    return _module("slime.utils.misc", load_function=load_function, SingletonMeta=SingletonMeta)


async def _get(url: str, **kwargs: Any) -> Any:
    if url.endswith("/workers"):
        return {"workers": []}
    raise AssertionError(f"slime's rollout asked {url}: not on a custom generate function's path")


async def _post(url: str, payload: Any, **kwargs: Any) -> Any:
    raise AssertionError("slime's own generate posted to the engine: the custom one was bypassed")


async def _abort_servers_until_idle(urls: list[str]) -> None:
    assert urls == []


async def _async_rm(args: Any, sample: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("Rule-based RM type is not specified.")


async def _batched_async_rm(args: Any, samples: list[Any], **kwargs: Any) -> list[Any]:
    return list(await asyncio.gather(*(_async_rm(args, s, **kwargs) for s in samples)))


class _Span:
    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextlib.contextmanager
def _trace_span(*args: Any, **kwargs: Any) -> Iterator[_Span]:
    yield _Span()


def _trace_function(*args: Any, **kwargs: Any) -> Any:
    return lambda function: function


class _Progress:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _unused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("only slime's own generate or eval uses this")


def _stand_ins() -> dict[str, ModuleType]:
    modules = {
        name: _package(name)
        for name in (
            "slime",
            "slime.utils",
            "slime.rollout",
            "slime.rollout.filter_hub",
            "slime.backends",
            "slime.backends.sglang_utils",
            "slime.observability",
        )
    }
    modules.update(
        {
            "slime.utils.types": _module("slime.utils.types", Sample=StandInSample),
            "slime.utils.misc": _misc(),
            "slime.utils.http_utils": _module(
                "slime.utils.http_utils",
                get=_get,
                post=_post,
                get_rollout_num_engines=lambda args: 1,
            ),
            "slime.utils.processing_utils": _module(
                "slime.utils.processing_utils",
                load_tokenizer=lambda *a, **k: None,
                load_processor=lambda *a, **k: None,
                build_processor_kwargs=_unused,
                encode_image_for_rollout_engine=_unused,
            ),
            "slime.utils.data": _module("slime.utils.data", Dataset=_unused),
            "slime.utils.eval_config": _module("slime.utils.eval_config", EvalDatasetConfig=object),
            "slime.observability.trace_utils": _module(
                "slime.observability.trace_utils",
                build_sglang_meta_trace_attrs=lambda meta: {},
                trace_function=_trace_function,
                trace_span=_trace_span,
            ),
            "slime.backends.sglang_utils.server_control": _module(
                "slime.backends.sglang_utils.server_control",
                abort_servers_until_idle=_abort_servers_until_idle,
            ),
            "slime.rollout.rm_hub": _module(
                "slime.rollout.rm_hub", async_rm=_async_rm, batched_async_rm=_batched_async_rm
            ),
        }
    )
    if importlib.util.find_spec("numpy") is None:
        modules["numpy"] = _module(
            "numpy", random=SimpleNamespace(choice=lambda items: random.choice(list(items)))
        )
    if importlib.util.find_spec("tqdm") is None:
        modules["tqdm"] = _module("tqdm", tqdm=_Progress)
    return modules
