"""The local backend: bubblewrap sandboxes on this machine, and plain host processes when asked
for by name (`isolation="none"`). Everything here is the local backend's alone; what both
backends share (the spec, results, errors, the `Sandbox` contract, capture) is one level up.

Where each part lives:

- the backend and a sandbox: _backend.py (`LocalBackend`), _config.py (`LocalConfig`,
  `Enforcement`), _sandbox.py (`LocalSandbox`), _commands.py (what every local sandbox shares:
  commands, output, files), _output.py (a command's output, capped), _host.py
  (`isolation="none"`, NOT a sandbox);
- booting one: _prepare.py (found once per backend), _boot.py (one sandbox's boot, step by
  step), _spawn.py (bwrap as a process), _booted.py (the live parts and their teardown),
  _populate.py (filling the workspace inside), _state.py (state directories on the host,
  sweeping leftovers);
- inside: _bwrap.py (bubblewrap's command line), _init.py (pid 1, runs inside), _control.py
  (the host's end of init's socket), _seccomp.py (the filter), _forward.py (one host endpoint
  relayed in);
- on the host: _uids.py and _subids.py (a host uid per sandbox), _stage.py (root's bind
  sources, staged), _cgroups.py (limits on a whole sandbox), _private_dirs.py and _owner.py
  (our directories in /tmp, and whose leftovers they are);
- a task's image as the root: _image_root.py (which paths appear where), _runtime.py (our
  interpreter on a foreign root), _snapshot.py (a base to capture against when the image's
  workspace is no repository).

The node's image cache (``sandbox/_images/``) serves only this backend but stays beside it: it
is a subsystem of its own (pulling, verifying and unpacking OCI images) with a public API.
"""

from sandbox._local._backend import LocalBackend
from sandbox._local._config import Enforcement, LocalConfig
from sandbox._local._control import InitGoneError
from sandbox._local._sandbox import LocalSandbox
from sandbox._local._uids import UidRange

__all__ = [
    "Enforcement",
    "InitGoneError",
    "LocalBackend",
    "LocalConfig",
    "LocalSandbox",
    "UidRange",
]
