"""The package's folders are its pipeline: no module imports from a later stage, and no module
sits loose at the top level."""

import ast
from pathlib import Path

import wsym

PACKAGE = Path(wsym.__file__).parent
#: Stages in pipeline order; a module may import from its own stage and earlier ones.
STAGES = {
    "errors": 0,
    "models": 1,
    "io": 1,
    "group": 2,
    "testing": 2,  # the public assertions read only the group
    "detect": 3,
    "align": 4,
    "sharpness": 5,
    "optim": 6,
    "zoo": 7,
    "metanet": 7,
    "report": 8,
    "cli": 9,
    "testing.oracles": 9,
}


def stage(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "wsym" or len(parts) < 2:
        return None
    return STAGES.get(".".join(parts[1:3]), STAGES.get(parts[1]))


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno


def test_no_module_imports_a_later_stage():
    later = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        own = stage(module)
        assert own is not None or module == "wsym.__init__", f"{module} belongs to no stage"
        for target, line in imports(path):
            theirs = stage(target)
            if own is not None and theirs is not None and theirs > own:
                later.append(f"{module}:{line} imports {target}")
    assert later == []


def test_every_module_sits_in_a_stage_folder():
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "errors.py"}
    )
    assert loose == []
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert set(folders) <= set(STAGES), set(folders) - set(STAGES)


def test_the_stage_check_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from wsym.metanet import fit\n")
    assert stage("wsym.metanet.fit") > stage("wsym.group.spec")
    assert [t for t, _ in imports(bad)] == ["wsym.metanet"]
