"""Recognising `python script.py …` and `python -m module …`, the forms torch-style launchers take apart.

torchrun, accelerate launch and deepspeed take the script (or `-m module`) themselves and run it
with their own interpreter, so `python x.py a b` becomes `<launcher flags> x.py a b`. Only the
unambiguous forms are taken apart: a bare interpreter name (`python`, `python3`, `python3.11`),
optionally `-u` (every one of these launchers runs workers unbuffered already), then a script or
`-m module`. Anything else — another program, a path to an interpreter, `-c`, `-O`, `-X …` — is
run verbatim through the launcher's "no python" switch, which keeps it exactly as written.
A `--` always separates the launcher's flags from what it runs (see script_argv).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?")
_DROPPED_OPTIONS = frozenset({"-u"})


@dataclass(frozen=True, slots=True)
class PythonCommand:
    interpreter: str
    """As written, e.g. `python3`."""
    target: str
    """The script path, or the module name when `module` is true."""
    module: bool
    """`-m target` rather than a script."""
    args: tuple[str, ...]
    """Everything after the script or module."""


def parse_python(argv: tuple[str, ...]) -> PythonCommand | None:
    """The script form of argv, or None when argv must run verbatim."""
    if not argv or not _INTERPRETER.fullmatch(argv[0]):
        return None
    i = 1
    while i < len(argv) and argv[i] in _DROPPED_OPTIONS:
        i += 1
    if i >= len(argv):
        return None  # a bare interpreter is an interactive prompt, not a program
    word = argv[i]
    if word == "-m":
        if i + 1 >= len(argv):
            return None
        return PythonCommand(argv[0], argv[i + 1], True, argv[i + 2:])
    if word.startswith("-m") and len(word) > 2:
        return PythonCommand(argv[0], word[2:], True, argv[i + 1:])
    if word.startswith("-"):
        return None
    return PythonCommand(argv[0], word, False, argv[i + 1:])


def script_argv(argv: tuple[str, ...], module_flag: str, no_python_flag: str) -> tuple[str, ...]:
    """What follows a torch-style launcher's flags: the script, `-m module`, or the program as is.

    A `--` ends the launcher's options: torchrun's and deepspeed's argparse parsers allow
    abbreviations, so without it a script argument such as `--m` is read as an ambiguous
    launcher option and the launch fails before the script starts (seen with torch 2.13).
    """
    python = parse_python(argv)
    if python is None:
        return (no_python_flag, "--", *argv)
    if python.module:
        return (module_flag, "--", python.target, *python.args)
    return ("--", python.target, *python.args)
