"""The package is a house without circles: no module imports, directly or through others, a
module that imports it back (imports inside functions included). Lower modules (model,
packing, errors) never reach up to higher ones (checkpoint, ppo_trainer, the scripts). Every
module is checked, those of methods/, lab/ and machinery/ too."""
import ast
import glob
import os

from test_scripts import ROOT


def module_name(path: str) -> str:
    """'mingpt_rlhf/lab/gradients.py' -> 'lab.gradients'; a subpackage's __init__.py -> 'lab'."""
    rel = os.path.relpath(path, os.path.join(ROOT, "mingpt_rlhf"))
    parts = os.path.splitext(rel)[0].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of_each_module() -> dict:
    """{module: the package's modules it imports}, every module named from the package's
    folder down ('model', 'machinery.checkpoint'), relative imports resolved."""
    graph = {}
    paths = glob.glob(os.path.join(ROOT, "mingpt_rlhf", "**", "*.py"), recursive=True)
    modules = {module_name(p) for p in paths}
    for path in paths:
        name = module_name(path)
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    module = ".".join(base + ([module] if module else []))
                elif module.startswith("mingpt_rlhf"):
                    module = module[len("mingpt_rlhf."):]
                else:
                    continue
                # `from .lab import hacking` imports the module lab.hacking, not only lab
                found = [f"{module}.{a.name}" if module else a.name for a in node.names]
                deps.update(m for m in found if m in modules)
                deps.update([module] if module in modules and not any(m in modules for m in found) else [])
            elif isinstance(node, ast.Import):
                deps.update(a.name[len("mingpt_rlhf."):] for a in node.names if a.name.startswith("mingpt_rlhf."))
        graph[name] = deps - {name, ""}
    return graph


def circles(graph: dict) -> list:
    """Every (a, b) where a imports b and b leads back to a."""
    def reaches(start, goal):
        seen, todo = set(), [start]
        while todo:
            for d in graph.get(todo.pop(), ()):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False
    return sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))


def test_no_module_imports_one_that_imports_it_back():
    graph = imports_of_each_module()
    assert {"model", "machinery.checkpoint", "ppo_trainer", "heads", "machinery.pretrained",
            "methods.episodes", "lab.gradients", "stages", "run.report"} <= set(graph)
    assert "machinery.errors" in graph["model"] and "model" in graph["stages"]
    assert circles(graph) == []


def folder_of(module: str) -> str:
    """'machinery.cli' -> 'machinery'; a module at the package's top -> 'recipe'."""
    return module.split(".")[0] if "." in module else "recipe"


def test_the_folders_show_their_layers():
    """machinery/ is what the recipe stands on: it imports nothing of the recipe, methods/,
    lab/ or run/. run/ is what runs it: nothing else imports run/. (The recipe and methods/ /
    lab/ import each other only where a table of losses.py or a hook of the trainer lists an
    entry of theirs.)"""
    graph = imports_of_each_module()
    up = sorted((a, b) for a in graph for b in graph[a]
                if folder_of(a) == "machinery" and folder_of(b) != "machinery")
    into_run = sorted((a, b) for a in graph for b in graph[a]
                      if folder_of(b) == "run" and folder_of(a) != "run")
    assert up == [] and into_run == []
    assert any(folder_of(b) == "machinery" for a in graph for b in graph[a] if folder_of(a) == "run")


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b"), ("b", "c"), ("c", "a")]
