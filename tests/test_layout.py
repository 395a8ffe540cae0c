"""The repository's layout is the one the README states: every top-level entry is in the README's module
table (and every row names one that exists), the paper's modules at the top import nothing from the
support folders, no module (the evaluator's included) imports its way back to itself, each folder's front
file lists its modules, every script is named where the docs say what it backs, every slow test is named
where the README and docs/testing.md leave it out of the default command, and the README reads in one
sitting.

    python -m pytest tests/test_layout.py
"""
from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
FOLDERS = ("driver", "report")   # the support folders of our own code (the evaluator has its own front)


def _ignored(name: str) -> bool:
    """Hidden entries, and what .gitignore leaves out at the top (runs/, caches): not part of the repository."""
    patterns = [p.strip().strip("/") for p in (REPO / ".gitignore").read_text().splitlines()
                if p.strip() and not p.startswith("#") and "/" not in p.strip().strip("/")]
    return name.startswith(".") or any(fnmatch.fnmatch(name, p) for p in patterns)


def module_table() -> list[str]:
    """The entries (files and folders) named in the first column of the README's module table."""
    section = README.split("\n## The modules", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name.rstrip("/") for row in rows for name in re.findall(r"`([^`]+)`", row)]


def test_every_top_level_entry_is_in_the_module_table():
    entries = sorted(p.name for p in REPO.iterdir() if not _ignored(p.name) and p.name != "README.md")
    table = module_table()
    assert [e for e in entries if e not in table] == []
    assert [t for t in table if not (REPO / t).exists()] == []


@pytest.mark.parametrize("module", sorted(p.name for p in REPO.glob("*.py") if p.name != "run.py"))
def test_the_papers_modules_import_nothing_from_the_support_folders(module):
    tree = ast.parse((REPO / module).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {*FOLDERS, "run"}, module


def test_no_module_imports_its_way_back_to_itself():
    """The import graph of the top level, driver/, report/ and the evaluator's package (imports inside
    functions too, relative ones resolved) has no circle."""
    files = [*REPO.glob("*.py"), *(p for f in (*FOLDERS, "evaluate_kernel") for p in (REPO / f).glob("*.py"))]
    names = {str(p.relative_to(REPO).with_suffix("")).replace("/", ".").removesuffix(".__init__"): p for p in files}
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                found |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:   # from . import x, from .x import y: within the package
                    parts = package.split(".")[:len(package.split(".")) - n.level + 1]
                    base = ".".join(parts + ([n.module] if n.module else []))
                found |= ({base} if n.module else set()) | {f"{base}.{a.name}" for a in n.names}
        graph[name] = found & set(names) - {name}
    assert {"evaluate_kernel.evaluation", "driver.evaluations"} <= set(graph) and graph["evaluate_kernel"]
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, " -> ".join(path[path.index(name):] + [name])
        if name not in done:
            for other in sorted(graph[name]):
                visit(other, path + [name])
            done.add(name)
    for name in sorted(graph):
        visit(name, [])


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folders_front_lists_its_modules(folder):
    front = ast.get_docstring(ast.parse((REPO / folder / "__init__.py").read_text()))
    listed = set(re.findall(r"^\s+(\w+\.py)\s", front, re.M))
    assert listed == {p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"}


def test_every_script_is_named_where_the_docs_say_what_it_backs():
    testing = (REPO / "docs" / "testing.md").read_text()
    for script in sorted((REPO / "scripts").iterdir()):
        if script.suffix in (".py", ".sh"):
            assert f"scripts/{script.name}" in testing, script.name
            head = script.read_text()[:600]
            assert "BENCHMARKS" in head or "docs/" in head or "README" in head, script.name


def test_every_slow_test_is_named_in_the_readme_and_in_docs_testing():
    """Tests marked `slow` leave the default command: the README's set-up and docs/testing.md say which."""
    setup = README.split("\n## Set up", 1)[1].split("\n## ", 1)[0]
    testing = (REPO / "docs" / "testing.md").read_text()
    slow = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = {ast.unparse(d) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                 for d in n.decorator_list}
        marks |= {ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)}
        if "pytest.mark.slow" in marks:
            slow.append(path.name)
    assert "test_replay.py" in slow and "test_ray_evaluator.py" in slow
    assert [name for name in slow if f"`{name}" not in setup or f"`{name}" not in testing] == []


def test_the_readme_s_cpu_torch_is_requirements_txt_s_range():
    """The README's command for torch's CPU build asks for the range requirements.txt asks for (else the next
    install would replace it)."""
    wanted = next(line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()
                  if line.startswith("torch"))
    setup = " ".join(README.split("\n## Set up", 1)[1].split("\n## ", 1)[0].split())
    assert f'pip install "{wanted}" --index-url https://download.pytorch.org/whl/cpu' in setup


def test_the_readme_reads_in_one_sitting():
    assert len(README.splitlines()) <= 250
    for doc in re.findall(r"\]\(([^)#]+)\)", README):
        assert (REPO / doc).exists(), doc
