"""Operator commands (retry a parked saga, list deadlines, sagas by state, ...).

Each module here defines functions usable from Python and registers its CLI commands with
`processor.cli.command`; the CLI imports every module of this package.
"""
