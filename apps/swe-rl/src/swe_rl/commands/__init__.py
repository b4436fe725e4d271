"""The app's commands, one module each: its name, help and description, `add_arguments` (its
subparser's arguments) and `run` (what it does, from the parsed arguments, its exit code).
`swe_rl.cli` assembles them into `swe-rl`. A module imports nothing heavy until it runs, so
`swe-rl --help` stays quick.
"""
