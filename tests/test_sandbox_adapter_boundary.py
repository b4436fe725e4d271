"""From inside a real sandbox, the adapter is reachable only through its agent port.

The admin API (open, read and close sessions) listens on its own port on the host; a sandbox's
only network is the forwarded agent port, where /admin answers 404. An agent can therefore
neither read nor close its own or anyone's session.
"""

from __future__ import annotations

from pathlib import Path

from protocol_adapters import AdapterConfig, AdminConfig, Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from sandbox import ForwardedEndpoint, LocalBackend, LocalConfig, SandboxSpec

INSIDE_PORT = 8080
# Talks HTTP/1.1 through bash's /dev/tcp: no client program needed in the sandbox.
HTTP_GET = (
    "exec 3<>/dev/tcp/127.0.0.1/{port} || exit 7; "
    "printf 'GET {path} HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {token}\\r\\n"
    "Connection: close\\r\\n\\r\\n' >&3; head -n1 <&3"
)


async def test_a_sandbox_reaches_the_agent_port_and_nothing_of_the_admin_api(
    qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    admin = AdminConfig(token="admin-secret-token")
    script = [ScriptedReply(text="unused")]
    async with local_stack(
        script,
        tokenizer_cache=tmp_path,
        vocabulary=qwen_vocabulary,
        config=AdapterConfig(admin=admin),
    ) as stack:
        server = stack.server
        assert server.admin_url is not None
        agent_port = int(server.url.rsplit(":", 1)[1])
        admin_port = int(server.admin_url.rsplit(":", 1)[1])
        session = server.sessions.open("episode")
        backend = LocalBackend(LocalConfig(state_root=tmp_path))
        spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", agent_port, INSIDE_PORT))
        async with await backend.create(spec) as box:

            async def get(port: int, path: str, token: str) -> str:
                command = HTTP_GET.format(port=port, path=path, token=token)
                result = await box.exec(command, timeout=10)
                return result.stdout.strip() if result.ok else f"unreachable ({result.exit_code})"

            assert (await get(INSIDE_PORT, "/v1/models", session.token)).endswith("200 OK")
            for token in (session.token, admin.token):
                assert (await get(INSIDE_PORT, "/admin/sessions", token)).endswith("404 Not Found")
                tree = f"/admin/sessions/{session.token}/tree"
                assert (await get(INSIDE_PORT, tree, token)).endswith("404 Not Found")
            for port in (admin_port, agent_port):  # the host's own listeners
                assert (await get(port, "/admin/sessions", admin.token)).startswith("unreachable")
        assert session.token in {s.token for s in server.sessions}  # untouched
