"""`uv run apps/swe-rl [...]`: the app's command line (see `swe-rl --help`)."""

from swe_rl.cli import main

raise SystemExit(main())
