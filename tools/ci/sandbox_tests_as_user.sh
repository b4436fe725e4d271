#!/usr/bin/env bash
# Run the sandbox package's tests as an unprivileged user, as root runs them in .ci/run.
#
# Sandboxes created by a non-root user take another path through the code: each runs as one of
# the user's subordinate ids, entered through a user namespace of the user's own (or, with
# LocalConfig(subordinate_ids=False), as the user itself), so the escape and limits suites run
# here a second time. The user gets a cgroup subtree delegated to it, as a cluster admin would
# do, so per-sandbox limits are real cgroups in this run too; the rlimit fallback is covered by
# the tests themselves (use_cgroups=False).
#
# Needs root (to create the user and delegate the cgroups). Usage:
#   bash tools/ci/sandbox_tests_as_user.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/../.."

user=sandbox-ci
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
# Subordinate ids for the user (useradd grants them on most systems; make sure), so that its
# sandboxes each run as a uid of their own, as rootless container engines do.
for file in /etc/subuid /etc/subgid; do
  grep -q "^$user:" "$file" 2>/dev/null || echo "$user:200000:65536" >> "$file"
done
home=$(getent passwd "$user" | cut -d: -f6)
work="$home/ci"

# A copy the user can read: the checkout may live under a directory only root can enter.
rm -rf "$work"
install -d -o "$user" "$work"
mkdir -p "$work/packages" && cp -r packages/sandbox "$work/packages/sandbox"
# The test helpers every member shares (the root pytest settings put them on the path).
mkdir -p "$work/tests" && cp -r tests/support "$work/tests/support"
rm -rf "$work/packages/sandbox/.pytest_cache"
cp pyproject.toml "$work/pyproject.toml"
python3 - "$work" <<'PY'
import sys, tomllib, pathlib
root = pathlib.Path(sys.argv[1])
config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["uv"]
(root / "constraints.txt").write_text("\n".join(config["constraint-dependencies"]) + "\n")
(root / "exclude-newer").write_text(config["exclude-newer"])
PY
chown -R "$user" "$work"
# The image tests' Debian root, built by root's run (the user reads it, never builds it).
if [ -d .cache/test-images ]; then
  cp -a .cache/test-images "$work/test-images"
fi

# uv itself, where the user can run it.
install -m 0755 "$(python3 -c 'import uv; print(uv.find_uv_bin())')" /usr/local/bin/uv

# A delegated cgroup subtree per hierarchy that has one of our controllers (v1 or v2).
parent=sandbox-ci
for controller in pids memory cpu; do
  for mount in "/sys/fs/cgroup/$controller" /sys/fs/cgroup/unified /sys/fs/cgroup; do
    if [ -e "$mount/cgroup.procs" ]; then
      mkdir -p "$mount/$parent"
      chown -R "$user" "$mount/$parent"
    fi
  done
done

# A clean environment, but the registry settings of this machine (certificates, index, proxy).
passed=()
for name in SSL_CERT_FILE SSL_CERT_DIR UV_INDEX_URL UV_DEFAULT_INDEX UV_NATIVE_TLS \
  HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  if [ -n "${!name:-}" ]; then passed+=("$name=${!name}"); fi
done

python=/usr/bin/python3
runuser -u "$user" -- env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
  "${passed[@]}" SANDBOX_TEST_CGROUP_PARENT="/$parent" SANDBOX_TEST_SUBORDINATE_IDS=1 UV_NO_PROGRESS=1 \
  SANDBOX_TEST_IMAGE_CACHE="$work/test-images" bash -c '
    set -euo pipefail
    cd ~/ci
    uv venv --quiet --python '"$python"' .venv
    uv pip install --quiet --python .venv --exclude-newer "$(cat exclude-newer)" \
      -c constraints.txt "./packages/sandbox[e2b]" --group packages/sandbox/pyproject.toml:test
    echo "-- sandbox tests as $(id -un) (uid $(id -u))"
    .venv/bin/python -m pytest packages/sandbox/tests -p no:cacheprovider "$@"
  ' bash "$@"
