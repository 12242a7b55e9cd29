"""--help in groups (cli.opt's `group`): train_ppo.py lists the recipe's options first, then
each variant's under its name. The groups change what --help shows, never what a command
line parses to: the same options, types and defaults as one flat list."""
import dataclasses
import importlib
import re
import typing

import pytest

import train_ppo
from mingpt_rlhf.machinery.cli import build_parser, parse_config
from mingpt_rlhf.run.rl_options import READ_ONLY_WITH, check_config, reads

SCRIPTS = ("train_sft", "train_rm", "train_ppo", "train_dpo", "sample")


def help_groups(config_cls) -> dict:
    """{a heading of --help: the options listed under it, in order}, read off the printed text."""
    groups, title = {}, None
    for line in build_parser(config_cls).format_help().splitlines():
        if re.match(r"\S.*:$", line):
            title = line[:-1]
            groups[title] = []
        elif title is not None and (m := re.match(r"  (?:-h, )?--(\w+)", line)):
            groups[title].append(m.group(1))
    return groups


def flat(config_cls):
    """The same options without their groups: the parser as it was before --help had them."""
    hints = typing.get_type_hints(config_cls)
    return dataclasses.make_dataclass("Flat", [
        (f.name, hints[f.name], dataclasses.field(default=f.default, metadata={"help": f.metadata["help"]}))
        for f in dataclasses.fields(config_cls)])


def every_option_changed(config_cls) -> list[str]:
    """A command line that gives every option a value other than its default."""
    argv = []
    for f in dataclasses.fields(config_cls):
        if isinstance(f.default, bool):
            argv += [f"--{f.name}={str(not f.default).lower()}"]
        elif isinstance(f.default, (int, float)):
            argv += [f"--{f.name}", str(f.default + 1)]
        else:
            argv += [f"--{f.name}", f.default + "_x"]
    return argv


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_is_in_exactly_one_group(script):
    config = importlib.import_module(script).Config
    listed = [name for names in help_groups(config).values() for name in names]
    assert sorted(listed) == sorted(["help"] + [f.name for f in dataclasses.fields(config)])
    assert all(help_groups(config).values()), "a heading with no option under it"


def test_train_ppo_lists_the_recipe_first_and_no_other_methods_options_in_it():
    groups = help_groups(train_ppo.Config)
    first, *variants = groups
    assert first == train_ppo.RECIPE and len(variants) >= 8, list(groups)
    recipe = set(groups[first])
    assert {"algo", "max_iters", "actor_lr", "kl_coef", "lam", "clip_range", "critic",
            "temperature", "eval_interval", "resume"} <= recipe
    # the book meets nothing of another method: an option that only another --algo reads
    # (READ_ONLY_WITH) is under that method's name, not the recipe's
    default, others = train_ppo.Config(), set()
    check_config(default)
    for algo in ("grpo", "rloo", "reinforce++", "online_dpo"):
        cfg = train_ppo.Config(algo=algo)
        check_config(cfg)
        others |= {name for name in READ_ONLY_WITH if reads(cfg, name) and not reads(default, name)}
    assert {"group_size", "grpo_norm", "dpo_beta", "ratio"} <= others
    assert not others & recipe, others & recipe


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_groups_parse_what_the_flat_list_parsed(script):
    config = importlib.import_module(script).Config
    grouped, plain = build_parser(config), build_parser(flat(config))

    def signature(parser):  # what parsing depends on, for each option
        return sorted((a.dest, tuple(a.option_strings), getattr(a.type, "__name__", None),
                       repr(a.default), a.nargs, a.const) for a in parser._actions)
    assert signature(grouped) == signature(plain)
    assert len(help_groups(flat(config))) == 1
    for argv in ([], every_option_changed(config), ["--seed", "7", "--resume"]
                 if script != "sample" else ["--seed=7", "--play_env"]):
        assert parse_config(config, argv) == config(**vars(plain.parse_args(argv)))
    if script == "train_ppo":  # one command line written out, as a user types it
        cfg = parse_config(config, ["--algo", "grpo", "--group_size", "4", "--lora_rank=8",
                                    "--env", "guess", "--mask_env", "false", "--resume"])
        assert cfg == train_ppo.Config(algo="grpo", group_size=4, lora_rank=8, env="guess",
                                       mask_env=False, resume=True)


def test_train_ppo_help_shows_its_examples_after_the_docstring(capsys):
    """The script's EXAMPLES (commands for the other methods and the machinery) follow its
    module docstring in --help, each a command that parses."""
    import pytest

    import train_ppo
    from mingpt_rlhf.machinery.cli import run
    with pytest.raises(SystemExit) as e:
        run(train_ppo.main, train_ppo.Config, ["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.index("Stage 3 of RLHF") < out.index("More runs:")
    commands = [line.split("#")[0].split("train_ppo.py", 1)[1].replace("\\", "").split()
                for line in train_ppo.EXAMPLES.splitlines() if "train_ppo.py" in line]
    assert len(commands) == 9
    for argv in commands:
        build_parser(train_ppo.Config).parse_args(argv)   # every option of every example exists
