"""ember/capture imports one way (ember.capture.IMPORT_LAYERS): no import inside a function holds
an import cycle together, and every top-level import goes down the declared layer order."""
import ast
import pathlib

import ember.capture
from ember.capture import IMPORT_LAYERS

PACKAGE = pathlib.Path(ember.capture.__file__).parent
ORDER = [name for layer in IMPORT_LAYERS for name in layer.split()]
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")


def _ember_imports(node: ast.Import | ast.ImportFrom) -> tuple[bool, list[str]]:
    """(does it import an ember module at all, the ember.capture modules it imports)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names if alias.name.split(".")[0] == "ember"]
        return bool(names), [n.split(".")[2] for n in names if n.startswith("ember.capture.")]
    if node.level == 0:
        if node.module is None or node.module.split(".")[0] != "ember":
            return False, []
        package = node.module
    else:
        base = ["ember", "capture"][:3 - node.level] if node.level <= 2 else []
        package = ".".join(base + ([node.module] if node.module else []))
    if package == "ember.capture":
        return True, [alias.name for alias in node.names if alias.name in MODULES]
    if package.startswith("ember.capture."):
        return True, [package.split(".")[2]]
    return True, []


def _imports(path: pathlib.Path) -> tuple[list[ast.AST], list[ast.AST]]:
    """(imports outside any function or class, imports inside one)."""
    outside: list[ast.AST] = []
    inside: list[ast.AST] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inside if in_function else outside).append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                           ast.ClassDef)))
    visit(ast.parse(path.read_text(), str(path)), False)
    return outside, inside


def test_every_module_has_one_layer():
    assert sorted(ORDER) == MODULES, "IMPORT_LAYERS must name every module of ember/capture once"


def test_no_ember_imports_inside_functions():
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        _, inside = _imports(path)
        for node in inside:
            is_ember, _ = _ember_imports(node)
            # a relative import is an ember import whatever it names
            if is_ember or isinstance(node, ast.ImportFrom) and node.level > 0:
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"function-local imports of ember modules: {found}"


def test_top_level_imports_go_down_the_layers():
    upward = []
    for name in MODULES:
        outside, _ = _imports(PACKAGE / f"{name}.py")
        for node in outside:
            for target in _ember_imports(node)[1]:
                if ORDER.index(target) >= ORDER.index(name):
                    upward.append(f"{name}.py:{node.lineno} imports {target}")
    assert not upward, f"imports that go up (or sideways) in IMPORT_LAYERS: {upward}"


def test_the_checker_sees_relative_imports():
    outside, _ = _imports(PACKAGE / "calls.py")
    targets = {t for node in outside for t in _ember_imports(node)[1]}
    assert {"builtins", "inline", "operations", "values"} <= targets
