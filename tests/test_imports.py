"""The package is a house without circles: no module imports, directly or through others, a
module that imports it back (imports inside functions included). Lower modules (model,
packing, errors) never reach up to higher ones (checkpoint, ppo_trainer, the scripts)."""
import ast
import glob
import os

from test_scripts import ROOT


def imports_of_each_module() -> dict:
    graph = {}
    for path in glob.glob(os.path.join(ROOT, "mingpt_rlhf", "*.py")):
        name = os.path.splitext(os.path.basename(path))[0]
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1 or module.startswith("mingpt_rlhf"):
                    parts = module.split(".")[1:] if module.startswith("mingpt_rlhf") else module.split(".")
                    deps.update([parts[0]] if parts and parts[0] else [a.name for a in node.names])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("mingpt_rlhf."))
        graph[name] = deps - {name}
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
    assert {"model", "checkpoint", "ppo_trainer", "heads", "pretrained"} <= set(graph)
    assert circles(graph) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b"), ("b", "c"), ("c", "a")]
