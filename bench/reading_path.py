"""The reading path of one default PPO iteration: every function of the package and of
train_ppo.py that one iteration of `python train_ppo.py` enters, and how many lines a reader
reads to follow it; and the path with its dispatch resolved: what PPOTrainer.__init__ chose for
each hook, and which entry of each table the iteration called.

    python bench/reading_path.py                    # prints the table, writes the JSON below
    python bench/reading_path.py --json /tmp/p.json --work /tmp/rp   # elsewhere; keep the runs

What runs: a tiny SFT policy and a tiny reward model (trained here, a few seconds), then
`train_ppo.main(Config(...))` with every default of train_ppo.py but the sizes (PPO_SIZES:
one iteration, small batches, few eval prompts, responses that fit the tiny model's block),
so `--reward rm` with one reward model, `--algo ppo`, the separate critic, the KL in the
reward, and so on. The curves' picture is switched off (MINGPT_RLHF_PLOT=0: it only imports
matplotlib, after the loop). The run is traced with `sys.settrace`; only frames whose file is
under mingpt_rlhf/ (its subfolders too) or is train_ppo.py are recorded (torch, tqdm, the
standard library and the code that dataclasses and NamedTuple generate are not), and the
module-level code that imports run is not counted. A function whose every line has run is no
longer traced line by line (its later calls are still recorded): that keeps the trace to a few
seconds.

The phases. train_ppo.main's own lines say where the run is:
- iteration: from the `for` loop of train_ppo.main that calls `.step(` (today `for step in
  bar:`) through the end of its body, and everything called from there. With one iteration
  the periodic eval and checkpoint inside the loop do not run (their lines are listed unrun).
- set-up: main's lines before that loop (config, models, data, trainer), and what they call.
- eval: any function of train_ppo.py named evaluate* (the eval at step 0 and the final one),
  and what it calls, wherever it is called from.
- end: main's lines after the loop (the final checkpoint, the summary, the report page).
A function entered in several phases is listed in the first of iteration, set-up, eval, end
that entered it; the later lists hold only what a reader meets there for the first time.

The count. Each function is counted once however often it ran, as a reader reads it: its
whole source, decorators, docstring, comments and blank lines included (the block that
`inspect.getsourcelines` returns). A function is a module-level function or a method (of a
class at module level, nested classes included); a function nested in one (a closure, a
lambda, a comprehension, a generator expression) is part of its parent's lines and is not
counted again, and its lines that ran are its parent's. A lambda at module level (an entry of
a table) counts its own lines. Each file visited adds its module docstring once. A record
built on the path (a dataclass or a NamedTuple of the package, whose `__init__` or `__new__`
Python writes itself, so no line of ours runs) counts its class's lines outside its methods
(decorators, docstring, fields), listed as "CLASS (fields)": a reader reads the fields to know
what the record holds. Other class bodies are not counted: only code that runs is.

The unrun lines. For each function, the statements of its body (nested functions' included)
that never ran anywhere in the traced run (any phase), with their line numbers and text: a
branch of another method inside the path shows up there. A compound statement counts as run
when its header line ran (or any statement inside it did). Left out: docstrings, `global` /
`nonlocal`, comments and blank lines (not statements), and the error paths: `raise`
statements, `assert` statements, and every block (an `if` / `elif` / `else` body, an
`except` handler) that ends with a `raise`.

Writes --json (bench/results/reading_path.json): per function {file, function, first_line,
phase, lines, ran_lines, unrun_lines: [[line, text], ...]}, per phase and per file the
totals, per phase the lines of each part of the tree ("parts": "iteration", train_ppo.py
and PPO's own files at the top of mingpt_rlhf/; "chapters", the recipe's GPT, tokenizer, data
and task; then methods/, lab/, machinery/ and run/), the revision (git rev-parse --short HEAD) and the date. tests/test_reading_path.py
runs the same trace and holds the iteration's total under a budget that only goes down.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import glob
import inspect
import json
import linecache
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "bench", "results", "reading_path.json")
PHASES = ("iteration", "set-up", "eval", "end")

# the tiny stages the traced run starts from (those of tests/test_scripts.py's sft_cfg and
# rm_cfg), and the sizes of the PPO run: everything else is train_ppo.py's default
SFT_OPTIONS = dict(batch_size=16, max_iters=20, eval_interval=10, eval_prompts=16, warmup_iters=2,
                   n_layer=1, n_head=2, n_embd=32, block_size=48)
RM_OPTIONS = dict(n_pairs=160, batch_size=16, eval_interval=5, norm_samples=32)
PPO_SIZES = dict(max_iters=1, rollout_batch_size=16, minibatch_size=8, eval_prompts=8,
                 max_new_tokens=24)


# ----------------------------------------------------------------------------- the tracer
class Tracer:
    """Records, for every code object of `files` that runs while the tracer is on (`with`),
    the line numbers that ran and the phases it ran in.

    `loop` = (code, first, last): while that code (train_ppo.main) runs a line, the phase is
    set-up before line `first`, iteration from `first` to `last`, end after; while any code
    of `eval_codes` is on the stack, the phase is eval. Without `loop` everything is
    iteration."""

    def __init__(self, files, loop=None, eval_codes=()):
        self.files = {os.path.realpath(f) for f in files}
        self.loop = loop
        self.eval_codes = set(eval_codes)
        self.outside_eval = "set-up" if loop else "iteration"
        self.eval_depth = 0
        self.phase = self.outside_eval
        self.lines: dict = {}    # code -> {line numbers that ran}
        self.phases: dict = {}   # code -> {phases it ran in}
        self.built: dict = {}    # a record class of ours built on the path -> {phases}
        self._real: dict = {}    # co_filename -> whether it is traced
        self._codes: dict = {}   # code -> (its lines that can run, its local trace function) or None

    def _new_code(self, code):
        """What the tracer keeps of a code object seen for the first time."""
        real = self._real.get(code.co_filename)
        if real is None:
            real = self._real[code.co_filename] = os.path.realpath(code.co_filename) in self.files
        if not real or code.co_name == "<module>":
            return None  # not ours, or an import running a module's body
        hit = self.lines[code] = set()
        self.phases[code] = set()
        add = hit.add

        def local(frame, event, arg):  # the common case, as little work per line as can be
            if event == "line":
                add(frame.f_lineno)
            return local
        if self.loop is not None and code is self.loop[0]:
            first, last = self.loop[1:]
            phases = self.phases[code]

            def local(frame, event, arg):  # noqa: F811 (train_ppo.main: its lines set the phase)
                if event == "line":
                    line = frame.f_lineno
                    add(line)
                    self.outside_eval = "set-up" if line < first else "iteration" if line <= last else "end"
                    if not self.eval_depth:
                        self.phase = self.outside_eval
                    phases.add(self.phase)
                return local
        elif code in self.eval_codes:
            def local(frame, event, arg):  # noqa: F811
                if event == "line":
                    add(frame.f_lineno)
                elif event == "return":  # (a generator's yield returns too; evaluate* is none)
                    self.eval_depth -= 1
                    self.phase = "eval" if self.eval_depth else self.outside_eval
                return local
        special = code in self.eval_codes or (self.loop is not None and code is self.loop[0])
        return [None if special else _lines_of(code), local]  # [lines left to see, local]

    def _call(self, frame, event, arg):
        code = frame.f_code
        known = self._codes.get(code, False)
        if known is False:
            known = self._codes[code] = self._new_code(code)
            if known is None and code.co_filename == "<string>":  # a generated __init__ / __new__?
                known = self._codes[code] = self._record_of(frame)
        if known is None:
            return None
        if isinstance(known, type):  # a record of ours, built: by which phase
            self.built.setdefault(known, set()).add(self.phase)
            return None
        if code in self.eval_codes:
            self.eval_depth += 1
            self.phase = "eval"
        self.phases[code].add(self.phase)
        lines, local = known
        if lines is not None and len(self.lines[code]) >= len(lines) and lines <= self.lines[code]:
            known[1] = None  # every line of it has run: no line events needed (a hot loop's speed)
            known[0] = None
        return known[1]

    def _record_of(self, frame):
        """The class of ours that a generated `__init__` (a dataclass's: `self`) or `__new__`
        (a NamedTuple's: `_cls`) builds, or None."""
        names = frame.f_code.co_varnames
        if not names or names[0] not in ("self", "_cls"):
            return None
        obj = frame.f_locals.get(names[0])
        cls = obj if names[0] == "_cls" else type(obj)
        try:
            path = os.path.realpath(inspect.getsourcefile(cls) or "")
        except TypeError:
            return None
        return cls if path in self.files else None

    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)
        return False


# the set-up of a frame, not a line of the source: no line event reports it
PROLOGUE = {"RESUME", "RETURN_GENERATOR", "POP_TOP", "COPY_FREE_VARS", "MAKE_CELL", "NOP"}


def _lines_of(code) -> set:
    """The lines of `code` that can report a line event (those holding an instruction
    besides a frame's set-up)."""
    import dis
    return {i.positions.lineno for i in dis.get_instructions(code)
            if i.opname not in PROLOGUE and i.positions and i.positions.lineno}


# ----------------------------------------------------------------------------- source analysis
class Function:
    """One counted function of a file: a module-level function, a method, or a module-level
    lambda; `node` its AST node, `start` its first line (its first decorator's)."""

    def __init__(self, path: str, qualname: str, node, start: int, end: int):
        self.path, self.qualname, self.node, self.start, self.end = path, qualname, node, start, end

    def lines(self) -> int:
        """Its lines as inspect.getsourcelines counts them (a lambda: the lines it spans)."""
        if isinstance(self.node, ast.Lambda):
            return self.end - self.start + 1
        return len(inspect.getblock(linecache.getlines(self.path)[self.start - 1:]))


def functions_of(path: str) -> list[Function]:
    """The counted functions of the file at `path`: module-level functions and methods (of
    classes at module level, nested classes included), and module-level lambdas."""
    tree = ast.parse("".join(linecache.getlines(path)), path)
    found = []

    def add(node, prefix):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        found.append(Function(path, prefix + node.name, node, start, node.end_lineno))

    def visit_class(cls, prefix):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                add(node, prefix)
            elif isinstance(node, ast.ClassDef):
                visit_class(node, f"{prefix}{node.name}.")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node, "")
        elif isinstance(node, ast.ClassDef):
            visit_class(node, f"{node.name}.")
        else:  # the lambdas of a table (a dict of small functions, at module level)
            for sub in ast.walk(node):
                if isinstance(sub, ast.Lambda):
                    target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
                    name = f"{target.id}: " if isinstance(target, ast.Name) else ""
                    found.append(Function(path, f"{name}<lambda> at line {sub.lineno}", sub,
                                          sub.lineno, sub.end_lineno))
    return found


def module_docstring_lines(path: str) -> int:
    tree = ast.parse("".join(linecache.getlines(path)), path)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def _is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def _header_lines(node) -> range:
    """The lines of a statement that run as the statement itself: a simple statement's
    every line; a compound statement's header, from its first decorator (a nested def) to the
    line before its body."""
    if not hasattr(node, "body") or not isinstance(node.body, list):
        return range(node.lineno, node.end_lineno + 1)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return range(start, max(start, node.body[0].lineno - 1) + 1)


def _blocks(node):
    """The statement lists directly inside a compound statement, each with whether it is an
    error path (a block that ends with `raise`)."""
    blocks = [node.body] if isinstance(getattr(node, "body", None), list) else []
    blocks += [getattr(node, "orelse", []), getattr(node, "finalbody", [])]
    blocks += [h.body for h in getattr(node, "handlers", [])]
    blocks += [case.body for case in getattr(node, "cases", [])]
    return [b for b in blocks if b]


def unrun_statements(function_node, ran: set) -> tuple[list[int], list[int]]:
    """(lines of statements that ran, lines of statements that did not) in the body of
    `function_node` (an ast FunctionDef or Lambda), given the set `ran` of line numbers that
    had a line event. Docstrings, global / nonlocal and error paths (raise, assert, blocks
    that end with raise) are in neither list."""
    ran_lines, unrun = [], []

    def visit(statements, is_function_body=False):
        for i, node in enumerate(statements):
            if i == 0 and is_function_body and _is_docstring(node):
                continue
            if isinstance(node, (ast.Raise, ast.Assert, ast.Global, ast.Nonlocal)):
                continue
            header = _header_lines(node)
            inside_ran = visit_children(node)
            if any(line in ran for line in header) or inside_ran:
                ran_lines.extend(header)
            else:
                unrun.extend(header)

    def visit_children(node) -> bool:
        """Visit the blocks of a compound statement; whether any statement in them ran."""
        before = len(ran_lines)
        for block in _blocks(node):
            if isinstance(block[-1], ast.Raise):
                continue  # an error path: `if ...: raise`, `except ...: raise`
            visit(block, is_function_body=isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        return len(ran_lines) > before

    if isinstance(function_node, ast.Lambda):  # one expression: it ran if it was entered
        span = range(function_node.lineno, function_node.end_lineno + 1)
        return (list(span), []) if any(line in ran for line in span) else ([], list(span))
    visit(function_node.body, is_function_body=True)
    return sorted(set(ran_lines)), sorted(set(unrun))


# ----------------------------------------------------------------------------- the report
def relative(path: str) -> str:
    path = os.path.realpath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def report(tracer: Tracer) -> dict:
    """The traced run as {functions: [...], phases: {phase: totals}, files: {...}}: each code
    that ran grouped into the counted function holding it (functions_of), listed in the first
    phase of PHASES it ran in."""
    by_file: dict = {}
    for code in set(tracer.lines) | set(tracer.phases):
        by_file.setdefault(os.path.realpath(code.co_filename), []).append(code)
    groups = {}  # (path, Function) -> [codes]
    for path, codes in by_file.items():
        functions = functions_of(path)
        for code in codes:
            line = code.co_firstlineno
            holder = [f for f in functions if f.start <= line <= f.end and not isinstance(f.node, ast.Lambda)]
            holder = holder or [f for f in functions if isinstance(f.node, ast.Lambda)
                                and f.start <= line <= f.end and f.node.lineno == line]
            if not holder:
                continue  # code outside any function (a class body run at import)
            # the innermost counted function holding the line (a method, not its class)
            f = max(holder, key=lambda f: f.start)
            groups.setdefault((path, f.start), (f, []))[1].append(code)

    rows = [record_row(cls, phases) for cls, phases in tracer.built.items()]
    for (path, _), (f, codes) in sorted(groups.items(), key=lambda kv: (relative(kv[0][0]), kv[0][1])):
        ran = set().union(*(tracer.lines.get(c, set()) for c in codes))
        phases = set().union(*(tracer.phases.get(c, set()) for c in codes))
        ran_lines, unrun = unrun_statements(f.node, ran)
        source = linecache.getlines(path)
        rows.append({
            "file": relative(path), "function": f.qualname, "first_line": f.start,
            "phase": next(p for p in PHASES if p in phases),
            "lines": f.lines(), "ran_lines": len(ran_lines),
            "unrun_lines": [[n, source[n - 1].rstrip("\n")] for n in unrun]})

    phases, files, seen_files = {}, {}, set()
    for phase in PHASES:
        listed = [r for r in rows if r["phase"] == phase]
        new_files = sorted({r["file"] for r in listed} - seen_files)
        seen_files |= set(new_files)
        docstrings = {f: module_docstring_lines(os.path.join(ROOT, f)) for f in new_files}
        function_lines = sum(r["lines"] for r in listed)
        phases[phase] = {"functions": len(listed), "function_lines": function_lines,
                         "new_files": len(new_files), "docstring_lines": sum(docstrings.values()),
                         "lines": function_lines + sum(docstrings.values()),
                         "unrun_lines": sum(len(r["unrun_lines"]) for r in listed)}
        for name in sorted({r["file"] for r in listed}):
            of_file = [r for r in listed if r["file"] == name]
            files.setdefault(phase, {})[name] = {
                "functions": len(of_file), "function_lines": sum(r["lines"] for r in of_file),
                "docstring_lines": docstrings.get(name, 0),
                "lines": sum(r["lines"] for r in of_file) + docstrings.get(name, 0),
                "unrun_lines": sum(len(r["unrun_lines"]) for r in of_file)}
    running = 0
    for phase in PHASES:
        running += phases[phase]["lines"]
        phases[phase]["lines_with_earlier_phases"] = running
    for phase in PHASES:  # the lines of each part of the tree (part_of)
        parts = {}
        for name, f in files.get(phase, {}).items():
            parts[part_of(name)] = parts.get(part_of(name), 0) + f["lines"]
        phases[phase]["parts"] = dict(sorted(parts.items()))
    body = {n: f for n, f in files.get("iteration", {}).items() if part_of(n) != "chapters"}
    phases["iteration"]["loop_body"] = {  # the iteration, chapters aside: what LOOP_BODY_GOAL bounds
        "lines": sum(f["lines"] for f in body.values()), "files": len(body),
        "unrun_lines": sum(f["unrun_lines"] for f in body.values())}
    return {"functions": rows, "phases": phases, "files": files}


def record_row(cls, phases) -> dict:
    """The row of a record class built on the path: its class's lines outside its methods
    (which are counted as functions when they run)."""
    path = inspect.getsourcefile(cls)
    tree = ast.parse("".join(linecache.getlines(path)), path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__
                and n.lineno == inspect.getsourcelines(cls)[1] + len([d for d in n.decorator_list]))
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    methods = sum(m.end_lineno - min([m.lineno] + [d.lineno for d in m.decorator_list]) + 1
                  for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return {"file": relative(path), "function": f"{cls.__qualname__} (fields)", "first_line": start,
            "phase": next(p for p in PHASES if p in phases),
            "lines": node.end_lineno - start + 1 - methods, "ran_lines": 0, "unrun_lines": []}


# what the iteration's loop body should come to, chapters aside: a reader follows it in one sitting
LOOP_BODY_GOAL = {"lines": 1100, "files": 12, "unrun_lines": 60}
# the recipe's chapters that one iteration calls but that are not PPO's: the GPT, the
# tokenizer, the data and the task (a reader learns them before PPO, as their own chapters)
CHAPTERS = ("mingpt_rlhf/model.py", "mingpt_rlhf/tokenizer.py", "mingpt_rlhf/data.py",
            "mingpt_rlhf/tasks.py", "mingpt_rlhf/task_base.py", "mingpt_rlhf/task_sort.py",
            "mingpt_rlhf/evaluate.py")


def part_of(name: str) -> str:
    """The part of the tree a file (relative to the repository) belongs to: "iteration" for
    train_ppo.py and PPO's own files at the top of mingpt_rlhf/ (the trainer, its math, the
    sampler, the log-probs, the heads, the optimizer, the rewards: what the by-hand count of
    the path covered), "chapters" for the recipe's other files (CHAPTERS), else its folder
    there (methods, lab, machinery, run)."""
    parts = name.split("/")
    if parts[0] == "mingpt_rlhf" and len(parts) > 2:
        return parts[1]
    return "chapters" if name in CHAPTERS else "iteration"


def unrun_blocks(row: dict) -> list[list]:
    """A function's unrun lines as blocks: [first, last, count, first line's text], a new
    block wherever a line that ran (or the gap of another statement) lies between two."""
    blocks = []
    for n, text in row["unrun_lines"]:
        if blocks and n - blocks[-1][1] <= 3:  # comments or a blank line between them
            blocks[-1][1] = n
            blocks[-1][2] += 1
        else:
            blocks.append([n, n, 1, text.strip()])
    return blocks


# ----------------------------------------------------------------------------- the default run
def training_loop(main) -> tuple[int, int]:
    """(first, last) line of the training loop of `main` (train_ppo.main): its top-level
    `for` statement whose body calls something's `.step(`."""
    path = inspect.getsourcefile(main)
    tree = ast.parse("".join(linecache.getlines(path)), path)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == main.__name__)
    for statement in node.body:
        if isinstance(statement, ast.For) and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "step"
                for c in ast.walk(statement)):
            return statement.lineno, statement.end_lineno
    raise SystemExit(f"no `for` loop calling .step( in {path}'s {main.__name__}: tell "
                     f"bench/reading_path.py where the iteration is now")


def eval_codes(module) -> list:
    """The code objects of the functions of `module` named evaluate* (its classes' methods and
    nested functions too)."""
    found = []

    def walk(code):
        for const in code.co_consts:
            if inspect.iscode(const):
                if const.co_name.startswith("evaluate"):
                    found.append(const)
                walk(const)
    functions = [v for v in vars(module).values()
                 if inspect.isfunction(v) and v.__module__ == module.__name__]
    for cls in vars(module).values():  # and the methods of its classes (Run.evaluate)
        if inspect.isclass(cls) and cls.__module__ == module.__name__:
            functions += [v for v in vars(cls).values() if inspect.isfunction(v)]
    for value in functions:
        if value.__name__.startswith("evaluate"):
            found.append(value.__code__)
        walk(value.__code__)
    return found


def package_files() -> list[str]:
    """The package's files (its subpackages' too) and train_ppo.py: the files traced."""
    folder = os.path.join(ROOT, "mingpt_rlhf")
    return glob.glob(os.path.join(folder, "**", "*.py"), recursive=True) + \
        [os.path.join(ROOT, "train_ppo.py")]


def train_stages(work: str) -> tuple[str, str]:
    """The tiny SFT policy and reward model the traced run starts from: (sft_dir, rm_dir)."""
    import train_rm
    import train_sft
    sft_dir, rm_dir = os.path.join(work, "sft"), os.path.join(work, "rm")
    train_sft.main(train_sft.Config(out_dir=sft_dir, **SFT_OPTIONS))
    train_rm.main(train_rm.Config(out_dir=rm_dir, sft_dir=sft_dir, **RM_OPTIONS))
    return sft_dir, rm_dir


def trace_default_iteration(sft_dir: str, rm_dir: str, out_dir: str) -> dict:
    """Trace `train_ppo.main` at every default but PPO_SIZES, from these stages; the report."""
    import torch._dynamo  # noqa: F401 (torch imports it on first use, a second of frames to skip)

    import train_ppo
    os.environ["MINGPT_RLHF_PLOT"] = "0"
    for path in package_files():  # the sources the report reads: the files that ran
        linecache.checkcache(path)
    main = train_ppo.main
    first, last = training_loop(main)
    cfg = train_ppo.Config(out_dir=out_dir, sft_dir=sft_dir, rm_dir=rm_dir, **PPO_SIZES)
    trainers, init = [], train_ppo.PPOTrainer.__init__

    def kept(self, *args, **kwargs):  # the run's trainer, to read the hooks it chose
        init(self, *args, **kwargs)
        trainers.append(self)
    train_ppo.PPOTrainer.__init__ = kept
    try:
        with Tracer(package_files(), loop=(main.__code__, first, last),
                    eval_codes=eval_codes(train_ppo)) as tracer:
            main(cfg)
    finally:
        train_ppo.PPOTrainer.__init__ = init
    result = report(tracer)
    ran = {code for code, phases in tracer.phases.items() if "iteration" in phases}
    result["dispatch"] = dispatch(ran, trainers[0])
    return result


# the trainer's hooks: what PPOTrainer.__init__ chooses once for the iteration to call
HOOKS = ("collect", "rollout", "sample", "slices", "values_of", "value_loss_in_actor",
         "critic_step", "against_sampler", "rollout_figures", "shape_scores", "rows_to_learn",
         "queue")


def dispatch(ran: set, trainer) -> dict:
    """The path with its dispatch resolved: {"hooks": {hook: what PPOTrainer.__init__ put
    there}, "tables": {"module.TABLE[key]": function}} for every entry of a module-level table
    of the package (a dict, or a dict of tuples of functions), in the module that defines it,
    whose code is in `ran` (the code objects the iteration ran)."""
    import functools
    import importlib
    import re

    def name_of(obj):
        obj = obj.func if isinstance(obj, functools.partial) else obj
        return getattr(obj, "__qualname__", type(obj).__qualname__)
    hooks = {h: name_of(getattr(trainer, h)) for h in HOOKS if hasattr(trainer, h)}
    tables = {}
    for path in sorted(package_files()):
        rel = relative(path)
        if not rel.startswith("mingpt_rlhf/"):
            continue
        module = importlib.import_module(rel[:-3].replace("/", "."))
        source = "".join(linecache.getlines(path))
        for table_name, table in vars(module).items():
            defined_here = re.search(rf"^{table_name}\s*[:=]", source, re.M)
            if not (table_name.isupper() and isinstance(table, dict) and defined_here):
                continue
            for key, entry in table.items():
                fns = [f for f in (entry if isinstance(entry, tuple) else (entry,)) if callable(f)]
                # an entry of several functions (a pair) counts when all of them ran
                if fns and all(getattr(f, "__code__", None) in ran for f in fns):
                    tables[f"{rel[12:-3].replace('/', '.')}.{table_name}[{key!r}]"] = \
                        [name_of(f) for f in fns]
    return {"hooks": hooks, "tables": {k: ", ".join(v) for k, v in sorted(tables.items())}}


def revision() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


# ----------------------------------------------------------------------------- the table
def print_table(result: dict, top: int = 12) -> None:
    rows, phases = result["functions"], result["phases"]
    it = phases["iteration"]
    print(f"\nOne default PPO iteration (train_ppo.py, {result.get('revision', '?')}): "
          f"{it['lines']} lines = {it['function_lines']} in {it['functions']} functions + "
          f"{it['docstring_lines']} of {it['new_files']} module docstrings; "
          f"{it['unrun_lines']} of those lines never ran")
    print("by part of the tree: " + ", ".join(f"{k} {v}" for k, v in it["parts"].items()))
    body = it["loop_body"]
    print("the loop body, chapters aside: " + ", ".join(
        f"{body[k]} {k.replace('_', ' ')} (goal {LOOP_BODY_GOAL[k]})" for k in LOOP_BODY_GOAL))
    for name, f in sorted(result["files"]["iteration"].items(), key=lambda kv: -kv[1]["lines"]):
        print(f"\n{name:44s} {f['lines']:5d} lines ({f['docstring_lines']} docstring), "
              f"{f['functions']} functions, {f['unrun_lines']} unrun")
        for r in rows:
            if r["file"] == name and r["phase"] == "iteration":
                print(f"    {r['function']:40s} {r['lines']:5d}   unrun {len(r['unrun_lines']):3d}")
    blocks = sorted(((b, r) for r in rows if r["phase"] == "iteration" for b in unrun_blocks(r)),
                    key=lambda br: -br[0][2])
    print(f"\nThe biggest blocks of the iteration's path that did not run (lines of statements):")
    for (first, last, n, text), r in blocks[:top]:
        print(f"  {n:3d}  {r['file']}:{first}-{last} ({r['function']})  {text[:60]}")
    if "dispatch" in result:
        print("\nThe dispatch at the defaults: what PPOTrainer.__init__ chose for each hook, and the")
        print("entry of each table the iteration called")
        for hook, fn in result["dispatch"]["hooks"].items():
            print(f"  trainer.{hook:22s} {fn}")
        for table, fn in result["dispatch"]["tables"].items():
            print(f"  {table:40s} {fn}")
    print("\nAlso read to follow the whole run (functions not on the iteration's path):")
    for phase in PHASES[1:]:
        p = phases[phase]
        print(f"  {phase:7s} +{p['lines']:5d} lines ({p['functions']} functions, "
              f"{p['new_files']} more files): {p['lines_with_earlier_phases']} so far")
        for name, f in sorted(result["files"].get(phase, {}).items(), key=lambda kv: -kv[1]["lines"]):
            names = [r["function"] for r in rows if r["file"] == name and r["phase"] == phase]
            print(f"      {name:40s} {f['lines']:5d}  {', '.join(names)[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=RESULTS, help="where to write the result")
    ap.add_argument("--work", default="", help="folder for the tiny runs (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="reading_path_")
    sft_dir, rm_dir = train_stages(work)
    result = trace_default_iteration(sft_dir, rm_dir, os.path.join(work, "ppo"))
    result = {"revision": revision(), "date": datetime.date.today().isoformat(),
              "run": {"script": "train_ppo.py", "options": PPO_SIZES, "sft": SFT_OPTIONS,
                      "rm": RM_OPTIONS},
              "total": result["phases"]["iteration"]["lines"], **result}
    print_table(result)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:  # one line per function: a diff shows what moved
        rows = ",\n  ".join(json.dumps(r) for r in result["functions"])
        rest = json.dumps({k: v for k, v in result.items() if k != "functions"}, indent=1)
        f.write(rest[:-2] + f',\n "functions": [\n  {rows}\n ]\n}}\n')
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
