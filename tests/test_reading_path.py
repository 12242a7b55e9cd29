"""bench/reading_path.py: the lines a reader reads to follow one default PPO iteration, held
under a budget that only goes down, and the tracer's own count checked on hand-made code.

BUDGET holds the iteration's own files (train_ppo.py and PPO's files at the top of
mingpt_rlhf/: the trainer, its math, the sampler, the log-probs, the heads, the optimizer, the
rewards) at what they measured; TOTAL is a ratchet on everything the iteration enters (the GPT, the
task, the machinery and the hacking monitor too): a change that makes either longer to read
fails here, and one that makes the whole shorter by more than 2 % fails until TOTAL is lowered.
"""
import importlib.util
import sys
import textwrap

from conftest import bench_module

BUDGET = 948   # the goal; the iteration's own files measured 948 with the records they build counted (Experience, GenerationOutput: +33) and the LR schedule in optim.py (+14)
TOTAL = 1612   # measured 2197 at d8d7665, 1912 at ff2f005, 1614 at 650ba27, 1621 with max_logratio; 1612 counting the records built on the path (+~90) after the warnings became a table, the hacking signals a table, distributed's one-process functions one line each, and the reference's Correction a plain pair

# the loop body (chapters aside) is 1275 lines in 14 files against a goal of 1100 in 12: what is
# over is the explanations of what each line does and the one-concept files (docs/testing.md);
# the unrun lines meet theirs, at most 60 (50 measured)
UNRUN = 60


def test_one_default_iteration_reads_within_the_budget(stages, tmp_path):
    reading_path = bench_module("reading_path")
    root = stages[0]  # the SFT and RM of reading_path.SFT_OPTIONS / RM_OPTIONS
    result = reading_path.trace_default_iteration(str(root / "sft"), str(root / "rm"),
                                                  str(tmp_path / "ppo"))
    listed = {phase: {(r["file"], r["function"]) for r in result["functions"] if r["phase"] == phase}
              for phase in reading_path.PHASES}
    # the phases are where they should be: the loop in the iteration, the rest around it
    assert {("train_ppo.py", "main"), ("mingpt_rlhf/ppo_trainer.py", "PPOTrainer.step"),
            ("mingpt_rlhf/ppo.py", "gae")} <= listed["iteration"]
    assert ("mingpt_rlhf/run/rl_options.py", "check_config") in listed["set-up"]
    assert ("mingpt_rlhf/run/rollouts.py", "RolloutRecorder.record") in listed["eval"]
    assert ("mingpt_rlhf/machinery/checkpoint.py", "save_checkpoint") in listed["end"]
    # no other method on the default path; from the lab only the reward-hacking monitor,
    # which the run's watcher calls (run/watch.py: one named call)
    on_path = set(result["files"]["iteration"])
    assert not {f for f in on_path if f.startswith("mingpt_rlhf/methods/")}, on_path
    assert {f for f in on_path if f.startswith("mingpt_rlhf/lab/")} <= {"mingpt_rlhf/lab/hacking.py"}
    # the dispatch resolved: PPO's own entry of each table and hook at the defaults
    hooks, tables = result["dispatch"]["hooks"], result["dispatch"]["tables"]
    assert hooks["collect"] == "collect_all" and hooks["against_sampler"] == "same_policy"
    assert tables["losses.POLICY_LOSSES['token']"] == "_token_ratio"
    assert tables["losses.ADVANTAGES['gae']"] == "_gae" and not any("'loss'" in t for t in tables)
    parts = result["phases"]["iteration"]["parts"]
    assert set(parts) <= {"iteration", "chapters", "machinery", "run", "lab"}, parts
    by_file = sorted(result["files"]["iteration"].items(), key=lambda kv: -kv[1]["lines"])
    files = ", ".join(f"{name} {f['lines']}" for name, f in by_file)
    assert parts["iteration"] <= BUDGET, (
        f"the iteration's own files now read in {parts['iteration']} lines, more than the "
        f"budget of {BUDGET} ({files}); python bench/reading_path.py lists every function")
    lines = result["phases"]["iteration"]["lines"]
    assert lines <= TOTAL, (f"one default PPO iteration now enters {lines} lines, more than "
                            f"{TOTAL} ({files}); python bench/reading_path.py lists them")
    assert lines >= 0.98 * TOTAL, (f"one default PPO iteration now enters {lines} lines: lower "
                                   f"TOTAL to {lines} (and rerun python bench/reading_path.py "
                                   f"for its JSON)")
    body = result["phases"]["iteration"]["loop_body"]  # chapters aside, as the goal counts
    assert body["lines"] == lines - parts.get("chapters", 0)
    assert body["unrun_lines"] <= UNRUN, (
        f"{body['unrun_lines']} lines of the loop body did not run at the defaults, more than "
        f"{UNRUN}: python bench/reading_path.py lists the blocks (another method's branch?)")


def load_module(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


FAKE = '''\
    """A fake module: its docstring
    is two lines."""


    def numbers(n):
        for i in range(n):
            yield i


    def outer(x):
        """Nested functions count in outer's lines."""
        def inner(y):
            return y + 1
        total = sum(inner(v) for v in numbers(x))
        if x > 100:
            total = -1
        elif x < 0:
            raise ValueError("negative")
        assert total >= 0, "positive"
        return total


    def never_called():
        return 0
'''


def test_the_tracer_counts_each_function_once_and_reports_an_untaken_branch(tmp_path):
    reading_path = bench_module("reading_path")
    fake, path = load_module(tmp_path, "fake_path", FAKE)
    with reading_path.Tracer([path]) as tracer:
        assert fake.outer(3) == 6
    result = reading_path.report(tracer)
    rows = {r["function"]: r for r in result["functions"]}
    assert set(rows) == {"numbers", "outer"}  # inner and the generator expression are outer's
    assert rows["numbers"]["lines"] == 3 and rows["numbers"]["unrun_lines"] == []
    assert rows["outer"]["lines"] == 11
    # the untaken branch is listed; the error path (raise) and the assert are not
    assert rows["outer"]["unrun_lines"] == [[16, "        total = -1"]]
    assert rows["outer"]["ran_lines"] == 6  # def inner, return y + 1, total =, if, elif, return
    assert result["phases"]["iteration"]["lines"] == 3 + 11 + 2  # + the module docstring, once
    assert result["phases"]["iteration"]["new_files"] == 1


FAKE_RECORDS = '''\
    from dataclasses import dataclass
    from typing import NamedTuple


    @dataclass
    class Built:
        """A record the path builds."""
        a: int
        b: int = 2

        def total(self):
            return self.a + self.b


    class Pair(NamedTuple):
        x: float
        y: float


    @dataclass
    class NeverBuilt:
        z: int


    def make():
        return Built(1).total() + Pair(1.0, 2.0).x
'''


def test_a_record_built_on_the_path_counts_its_fields(tmp_path, monkeypatch):
    """A dataclass's __init__ and a NamedTuple's __new__ are Python's code, not ours: the
    records the path builds are counted as their class's lines outside their methods (the
    method that ran is counted as itself); a record never built is not."""
    reading_path = bench_module("reading_path")
    fake, path = load_module(tmp_path, "fake_records", FAKE_RECORDS)
    monkeypatch.setitem(sys.modules, "fake_records", fake)  # (where a class's source is found)
    with reading_path.Tracer([path]) as tracer:
        assert fake.make() == 4.0
    rows = {r["function"]: r for r in reading_path.report(tracer)["functions"]}
    assert set(rows) == {"Built (fields)", "Built.total", "Pair (fields)", "make"}
    assert rows["Built (fields)"]["lines"] == 6  # @dataclass, class, docstring, a, b, a blank line
    assert rows["Pair (fields)"]["lines"] == 3
    assert rows["Built.total"]["lines"] == 2


FAKE_SCRIPT = '''\
    def prepare():
        return 1


    class Trainer:
        def step(self):
            return helper()


    def helper():
        return 2


    def evaluate():
        return helper() + prepare()


    def finish():
        return 3


    def main(n):
        prepare()
        trainer = Trainer()
        evaluate()
        for step in range(n):
            trainer.step()
        evaluate()
        return finish()
'''


def test_the_phases_follow_mains_lines_and_the_evals(tmp_path):
    """What the loop of main calls is the iteration, even when the set-up or an eval calls it
    too; the rest falls in the first phase that entered it."""
    reading_path = bench_module("reading_path")
    fake, path = load_module(tmp_path, "fake_script", FAKE_SCRIPT)
    first, last = reading_path.training_loop(fake.main)
    assert (first, last) == (26, 27)
    with reading_path.Tracer([path], loop=(fake.main.__code__, first, last),
                             eval_codes=reading_path.eval_codes(fake)) as tracer:
        fake.main(2)
    phases = {r["function"]: r["phase"] for r in reading_path.report(tracer)["functions"]}
    assert phases == {"main": "iteration", "Trainer.step": "iteration", "helper": "iteration",
                      "prepare": "set-up", "evaluate": "eval", "finish": "end"}


def test_unrun_lines_of_a_hand_made_function():
    """The statements that did not run, given the lines that did: a multi-line statement runs
    when any of its lines does; `else:` is no statement; error paths are never listed."""
    import ast
    reading_path = bench_module("reading_path")
    source = textwrap.dedent('''\
        def f(a, b):
            """Doc."""
            x = g(a,
                  b)
            if a:
                y = 1
            else:
                y = 2
            try:
                z = h()
            except KeyError:
                raise ValueError("x")
            if not z:
                raise ValueError("y")
            for i in range(3):
                pass
            return y
        ''')
    node = ast.parse(source).body[0]
    ran, unrun = reading_path.unrun_statements(node, {4, 5, 6, 9, 10, 13, 15, 16, 17})
    assert unrun == [8]
    assert ran == [3, 4, 5, 6, 9, 10, 13, 15, 16, 17]
    # nothing after the `try` ran: its body, the loop and the return are listed, whole
    ran, unrun = reading_path.unrun_statements(node, {5, 6, 9})
    assert unrun == [3, 4, 8, 10, 13, 15, 16, 17]
