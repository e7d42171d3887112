"""Daemon settings: every flag also has a config-file key and a NODUS_* environment variable.

Precedence: command-line flag, then environment, then the config file (YAML), then the default.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml


def resolve(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parses argv; options left unset are filled from NODUS_<DEST> and then from --config's file.

    The parser's options must default to None so that "unset" can be told apart; real defaults are
    passed as `parser.set_defaults(_defaults={...})`.
    """
    args = parser.parse_args(argv)
    defaults: dict[str, Any] = getattr(args, "_defaults", {}) or {}
    config_path = args.config or os.environ.get("NODUS_CONFIG")
    file_values: dict[str, Any] = {}
    if config_path:
        try:
            loaded = yaml.safe_load(Path(config_path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            parser.error(f"--config {config_path}: {e}")
        if not isinstance(loaded, dict):
            parser.error(f"--config {config_path}: expected a mapping of settings")
        file_values = {str(k).replace("-", "_"): v for k, v in loaded.items()}
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(file_values) - known)
        if unknown:
            parser.error(f"--config {config_path}: unknown settings {', '.join(unknown)}")
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "config", "_defaults") or getattr(args, dest, None) is not None:
            continue
        env = os.environ.get("NODUS_" + dest.upper())
        if env is not None:
            value: Any = env
            if callable(action.type):
                value = action.type(env)
            elif isinstance(action, argparse._StoreTrueAction):
                value = env.lower() in ("1", "true", "yes")
        elif dest in file_values:
            value = file_values[dest]
        else:
            value = defaults.get(dest)
        setattr(args, dest, value)
    return args
