"""From a config dataclass to a command line, and the exit-status-2 wrapper.

Each script declares one `@dataclass` whose fields are its options; `opt(default, help)` puts
the one-line meaning next to the field, and it becomes the `--help` text. No config framework:
the dataclass *is* the documentation of the script. A `group` files an option under a heading
of `--help`, in the order the groups first appear; an option without one joins the first group,
the script's own options (train_ppo.py: PPO's, then each variant's options under its name).

    @dataclass
    class Config:
        lr: float = opt(1e-3, "peak learning rate")
        lora_rank: int = opt(0, "LoRA rank (0 = off)", group=MACHINERY)

    if __name__ == "__main__":
        run(main, Config)   # parses --lr 3e-4 or --lr=3e-4; UserError -> "error: ..." exit 2
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from .errors import UserError


# the group of the options that change how a run is computed, never what: the same in every script
MACHINERY = "machinery: device, precision, LoRA, memory and speed"


def opt(default, help: str, group: str = ""):
    """A config field with its help text, under `group`'s heading in --help (none: the first)."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group})


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
    # the usage line stays one line: the groups below list the options, each under its heading
    parser = OneLineParser(description=description, usage="%(prog)s [-h] [--option VALUE ...]",
                           formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    fields = dataclasses.fields(config_cls)
    first = fields[0].metadata.get("group") or "options"
    groups = {first: parser.add_argument_group(first)}
    groups[first].add_argument("-h", "--help", action="help", help="show this help and exit")
    hints = typing.get_type_hints(config_cls)
    for f in fields:
        title = f.metadata.get("group") or first
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        kind = hints[f.name]
        help_text = f"{f.metadata.get('help', '')} (default: {f.default!r})"
        if kind is bool:
            # `--resume` alone means true; `--resume false` is accepted too
            groups[title].add_argument(f"--{f.name}", type=_parse_bool, nargs="?", const=True,
                                       default=f.default, help=help_text, metavar="BOOL")
        else:
            groups[title].add_argument(f"--{f.name}", type=kind, default=f.default,
                                       help=help_text, metavar=kind.__name__.upper())
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
    """Parse the command line into `config_cls`, call `main(cfg)`; a UserError exits with 2.
    --help shows the script's module docstring, then its EXAMPLES (if it has them)."""
    module = sys.modules[main.__module__]
    description = (module.__doc__ or "") + getattr(module, "EXAMPLES", "")
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
