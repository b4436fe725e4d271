"""Host programs (ReadOnlyBind.host_programs) in any image: a program built for the host's glibc
starts through the host's loader with its libraries mounted beside it, even where the image has
no libc, and the image's own programs it starts run on the image's libraries; on the host's
root, and for a static program, nothing comes in between. `start_argv` starts a program with no
shell (an image without one runs it too)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path, PurePosixPath

import pytest

from sandbox import (
    ImageWorkspace,
    LocalBackend,
    Process,
    ReadOnlyBind,
    RootfsImage,
    Sandbox,
    SandboxSpec,
    UnsupportedSpecError,
)
from sandbox._local._runtime import RUNTIME_MOUNT, HostRuntime

from .conftest import local_config
from .image_roots import debian_root, static_root

TOOLS = PurePosixPath("/run/tools")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_tools(tmp_path: Path, *names: str) -> Path:
    """A directory with copies of the host's own programs (glibc-linked, as an agent CLI is)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in names:
        found = shutil.which(name)
        assert found is not None, name
        shutil.copy2(os.path.realpath(found), tools / name)
    return tools


def bind(tools: Path, *programs: str) -> ReadOnlyBind:
    return ReadOnlyBind(tools, TOOLS, host_programs=programs)


def debian() -> RootfsImage:
    return RootfsImage(debian_root(), env={"PATH": PATH}, working_dir=PurePosixPath("/testbed"))


async def output(process: Process) -> str:
    result = await process.wait(timeout=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def run(box: Sandbox, program: str, *args: str) -> str:
    argv = box.host_program_argv(str(TOOLS / program))
    return await output(await box.start_argv([*argv, *args]))


async def test_a_host_program_runs_in_an_image_without_libc_or_shell(
    backend: LocalBackend, tmp_path: Path
) -> None:
    root = static_root(tmp_path)
    tools = host_tools(tmp_path, "cat")
    spec = SandboxSpec(image=RootfsImage(root), read_only_binds=(bind(tools, "cat"),))
    async with await backend.create(spec) as box:
        argv = box.host_program_argv(str(TOOLS / "cat"))
        assert argv[1:] == ("--library-path", "/run/sandbox/runtime", str(TOOLS / "cat"))
        assert await run(box, "cat", "/etc/marker") == "the image's own /etc\n"
        maps = await run(box, "cat", "/proc/self/maps")
        assert "/run/sandbox/runtime/libc.so.6" in maps
        environ = await run(box, "cat", "/proc/self/environ")
        assert "LD_LIBRARY_PATH" not in environ


async def test_what_a_host_program_starts_runs_on_the_images_own_libraries(
    backend: LocalBackend, tmp_path: Path
) -> None:
    tools = host_tools(tmp_path, "env")
    image = RootfsImage(debian_root(), env={"PATH": PATH}, working_dir=PurePosixPath("/testbed"))
    spec = SandboxSpec(
        image=image, workspace=ImageWorkspace(), read_only_binds=(bind(tools, "env"),)
    )
    async with await backend.create(spec) as box:
        maps = await run(box, "env", "/bin/cat", "/proc/self/maps")
        libc = {line.split()[-1] for line in maps.splitlines() if "libc.so" in line}
        assert libc == {"/usr/lib/x86_64-linux-gnu/libc.so.6"}, maps  # the image's, not ours
        listed = await run(box, "env")
        assert "LD_LIBRARY_PATH" not in listed


async def test_on_the_hosts_root_and_for_a_static_program_nothing_comes_between(
    backend: LocalBackend, tmp_path: Path
) -> None:
    tools = host_tools(tmp_path, "cat")
    shutil.copy2(static_root(tmp_path) / "bin" / "hello", tools / "hello")
    spec = SandboxSpec(read_only_binds=(bind(tools, "cat", "hello"),))
    async with await backend.create(spec) as box:
        assert box.host_program_argv(str(TOOLS / "cat")) == (str(TOOLS / "cat"),)
        assert "/run/sandbox/runtime" not in await run(box, "cat", "/proc/self/maps")
    image = SandboxSpec(
        image=RootfsImage(tmp_path / "static-root"), read_only_binds=spec.read_only_binds
    )
    async with await backend.create(image) as box:
        assert box.host_program_argv(str(TOOLS / "hello")) == (str(TOOLS / "hello"),)
        assert await run(box, "hello") == "static hello\n"


async def test_without_isolation_every_program_is_the_hosts_own(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    backend = LocalBackend(local_config(tmp_path / "state", isolation="none"))
    env = os.path.realpath(str(shutil.which("env")))
    async with await backend.create(SandboxSpec(env={"MARK": "spec"})) as box:
        assert box.host_program_argv(env) == (env,)
        listed = await output(await box.start_argv([env], unset_env=("MARK",)))
        assert "MARK=" not in listed


async def test_a_program_the_spec_did_not_name_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    tools = host_tools(tmp_path, "cat", "env")
    spec = SandboxSpec(
        image=RootfsImage(static_root(tmp_path)), read_only_binds=(bind(tools, "cat"),)
    )
    async with await backend.create(spec) as box:
        with pytest.raises(ValueError, match="not a host program"):
            box.host_program_argv(str(TOOLS / "env"))


async def test_a_program_for_another_loader_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The host's loader is the only one mounted: a program naming another (a musl build on
    the host, say) could not start through it."""
    tools = host_tools(tmp_path, "cat")
    binary = (tools / "cat").read_bytes()
    loader = b"/lib64/ld-linux-x86-64.so.2"
    assert loader in binary
    (tools / "cat").write_bytes(binary.replace(loader, b"/lib/ld-musl-x86_64.so.1\0\0\0", 1))
    spec = SandboxSpec(
        image=RootfsImage(static_root(tmp_path)), read_only_binds=(bind(tools, "cat"),)
    )
    with pytest.raises(UnsupportedSpecError, match="ld-musl"):
        await backend.create(spec)
    assert list((tmp_path / "state").iterdir()) == []


async def test_a_bind_into_the_images_read_only_directories_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The image's /opt is read-only: no mount point can be made in it (bwrap would fail)."""
    tools = host_tools(tmp_path, "cat")
    opt = ReadOnlyBind(tools, PurePosixPath("/opt/tools"))
    with pytest.raises(UnsupportedSpecError, match="cannot bind at /opt/tools"):
        await backend.create(SandboxSpec(image=debian(), read_only_binds=(opt,)))
    top = ReadOnlyBind(tools, PurePosixPath("/tools"))  # a top-level name the image lacks
    async with await backend.create(SandboxSpec(image=debian(), read_only_binds=(top,))) as box:
        assert await box.read_file("/tools/cat") == (tools / "cat").read_bytes()


@pytest.mark.parametrize("program", ["", "/bin/cat", "../cat", "a/../cat", "a//cat", "./cat"])
def test_a_host_program_is_a_plain_path_inside_its_bind(program: str) -> None:
    with pytest.raises(ValueError, match="plain relative path"):
        ReadOnlyBind(Path("/opt"), TOOLS, host_programs=(program,))


async def test_start_argv_drops_what_it_is_told_and_layers_env_over_the_rest(
    backend: LocalBackend, tmp_path: Path
) -> None:
    tools = host_tools(tmp_path, "env")
    spec = SandboxSpec(
        env={"DROPPED": "spec", "KEPT": "spec", "REPLACED": "spec"},
        read_only_binds=(bind(tools, "env"),),
    )
    async with await backend.create(spec) as box:
        argv = box.host_program_argv(str(TOOLS / "env"))
        process = await box.start_argv(
            argv, env={"REPLACED": "call", "ADDED": "call"}, unset_env=("DROPPED", "REPLACED")
        )
        variables = dict(line.split("=", 1) for line in (await output(process)).splitlines())
        assert "DROPPED" not in variables
        assert (variables["KEPT"], variables["REPLACED"], variables["ADDED"]) == (
            "spec",
            "call",
            "call",
        )


def test_the_runtime_is_one_directory_made_once_per_closure(tmp_path: Path) -> None:
    """The loader and libraries a sandbox on an image needs are one bind, not one per file
    (each bind is a mount in every sandbox's creation): gathered once, reused, and made anew
    for another closure."""
    python = Path(os.path.realpath(sys.executable))
    runtime = HostRuntime.discover(python, Path(sys.base_prefix))
    made = runtime.materialize(tmp_path)
    assert runtime.materialize(tmp_path) == made
    names = {runtime.loader.name, *(name for name, _ in runtime.libraries)}
    assert {p.name for p in made.iterdir()} == names
    for name, path in runtime.libraries:
        assert (made / name).read_bytes() == path.read_bytes()
    mounts = runtime.mounts(python, PurePosixPath("/run/sandbox/python"), made)
    assert mounts[0] == (made, RUNTIME_MOUNT)
    assert len(mounts) == 3
    git = Path(os.path.realpath(shutil.which("git") or "/usr/bin/git"))
    wider = runtime.including([git])
    if wider.libraries != runtime.libraries:
        assert wider.materialize(tmp_path) != made
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("runtime-staging-")]


async def test_a_sandbox_on_an_image_sees_the_runtime_in_one_directory(
    backend: LocalBackend, tmp_path: Path
) -> None:
    spec = SandboxSpec(image=RootfsImage(static_root(tmp_path)))
    async with await backend.create(spec) as box:
        listed = await box.run_python(
            "import os; print('\\n'.join(sorted(os.listdir('/run/sandbox/runtime'))))"
        )
    assert listed.exit_code == 0, listed.stderr
    python = Path(os.path.realpath(sys.executable))
    runtime = HostRuntime.discover(python, Path(sys.base_prefix))
    wanted = {runtime.loader.name, *(name for name, _ in runtime.libraries)}
    assert wanted <= set(listed.stdout.decode().split())
