"""From a config dataclass to a command line, and the exit-status-2 wrapper.

Each script declares one `@dataclass` whose fields are its options; `opt(default, help)` puts
the one-line meaning next to the field, and it becomes the `--help` text. No config framework:
the dataclass *is* the documentation of the script.

    @dataclass
    class Config:
        lr: float = opt(1e-3, "peak learning rate")

    if __name__ == "__main__":
        run(main, Config)   # parses --lr 3e-4 or --lr=3e-4; UserError -> "error: ..." exit 2
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from .errors import UserError


def opt(default, help: str):
    """A config field with its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is a UserError: one line, exit 2 (no usage block)."""

    def error(self, message):
        # argparse prints its usage block too; we keep bad input to one line (docs/troubleshooting.md)
        raise UserError(f"{message} (see --help)")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser(config_cls, description: str = "") -> argparse.ArgumentParser:
    parser = OneLineParser(description=description,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        kind = hints[f.name]
        help_text = f"{f.metadata.get('help', '')} (default: {f.default!r})"
        if kind is bool:
            # `--resume` alone means true; `--resume false` is accepted too
            parser.add_argument(f"--{f.name}", type=_parse_bool, nargs="?", const=True,
                                default=f.default, help=help_text, metavar="BOOL")
        else:
            parser.add_argument(f"--{f.name}", type=kind, default=f.default, help=help_text,
                                metavar=kind.__name__.upper())
    return parser


def require_positive(cfg, *names: str) -> None:
    """UserError naming the first of these options that is not > 0."""
    for name in names:
        if getattr(cfg, name) <= 0:
            raise UserError(f"--{name} must be positive, got {getattr(cfg, name)}")


def require_non_negative(cfg, *names: str) -> None:
    """UserError naming the first of these options that is < 0."""
    for name in names:
        if getattr(cfg, name) < 0:
            raise UserError(f"--{name} must be >= 0, got {getattr(cfg, name)}")


def require_data_for_eval_data(cfg) -> None:
    """--eval_data without --data would be ignored silently: refuse it."""
    if cfg.eval_data and not cfg.data:
        raise UserError("--eval_data goes with --data (the built-in task has its own held-out "
                        "data); pass your training data as --data too")


def parse_config(config_cls, argv=None, description: str = ""):
    args = build_parser(config_cls, description).parse_args(argv)
    return config_cls(**vars(args))


def run(main, config_cls, argv=None):
    """Parse the command line into `config_cls`, call `main(cfg)`; a UserError exits with 2."""
    description = sys.modules[main.__module__].__doc__ or ""
    try:
        cfg = parse_config(config_cls, argv, description)
        return main(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact (use --resume to continue)",
              file=sys.stderr)
        sys.exit(130)
