"""Every call the documentation shows exists: the python code blocks of README.md and docs/ are
parsed (not run), and each call of a capinterp name (``ci.X(...)``, ``ci.X.Y(...)``, ``Class.method(...)``,
and methods of objects whose type the block makes clear: ``base = ci.evaluate(...)``, then
``base.correct()``) is bound to the real signature with placeholder values
(:meth:`inspect.Signature.bind`). A keyword the function does not take, too many positional
arguments, a missing required argument or a name capinterp does not have fails the test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import capinterp

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(?:python|py)[ \t]*\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Obj:
    """A module, class or function the code names."""

    value: Any


@dataclass(frozen=True)
class Inst:
    """An instance of ``cls`` (the return type of a call the code made)."""

    cls: type


def _ours(obj: Any) -> bool:
    name = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None) or ""
    return name == "capinterp" or name.startswith("capinterp.")


def _return_type(func: Any, receiver: type | None) -> Inst | None:
    """The class a function or method returns, from its annotation, when it is a plain class."""
    target = getattr(func, "__func__", func)
    try:
        ret = typing.get_type_hints(target).get("return")
    except Exception:  # unresolvable forward references: fall back to the raw annotation
        ret = inspect.signature(target).return_annotation
    if receiver is not None and (ret is typing.Self or ret in ("Self", receiver.__name__)):
        return Inst(receiver)
    if isinstance(ret, type) and _ours(ret):
        # a base-class method returning its own class (fit returns self): keep the subclass
        if receiver is not None and issubclass(receiver, ret):
            return Inst(receiver)
        return Inst(ret)
    return None


class Checker:
    """Walks the statements of a file's code blocks in order, tracking what each name holds."""

    def __init__(self) -> None:
        self.env: dict[str, Obj | Inst | None] = {"ci": Obj(capinterp), "capinterp": Obj(capinterp)}
        self.problems: list[str] = []
        self.checked = 0

    # statements -------------------------------------------------------------------------------
    def run(self, code: str, where: str) -> None:
        self.where = where
        for stmt in ast.parse(code).body:
            self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Import):
            for a in s.names:
                mod = importlib.import_module(a.name) if a.name.split(".")[0] == "capinterp" else None
                if a.asname:
                    self.env[a.asname] = Obj(mod) if mod else None
                else:
                    self.env[a.name.split(".")[0]] = Obj(capinterp) if mod else None
        elif isinstance(s, ast.ImportFrom):
            ours = (s.module or "").split(".")[0] == "capinterp"
            mod = importlib.import_module(s.module) if ours and s.module else None
            for a in s.names:
                value = getattr(mod, a.name, None) if mod else None
                if ours and value is None:
                    self.fail(s, f"from {s.module} import {a.name}: no such name")
                self.env[a.asname or a.name] = Obj(value) if value is not None else None
        elif isinstance(s, ast.Assign):
            value = self.expr(s.value)
            for t in s.targets:
                self.bind(t, value)
        elif isinstance(s, ast.AnnAssign | ast.AugAssign):
            value = self.expr(s.value) if s.value is not None else None
            self.bind(s.target, value if isinstance(s, ast.AnnAssign) else None)
        elif isinstance(s, ast.With):
            for item in s.items:
                self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None)
            for b in s.body:
                self.stmt(b)
        elif isinstance(s, ast.For):
            self.expr(s.iter)
            self.bind(s.target, None)
            for b in s.body + s.orelse:
                self.stmt(b)
        elif isinstance(s, ast.If | ast.While):
            self.expr(s.test)
            for b in s.body + s.orelse:
                self.stmt(b)
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def bind(self, target: ast.expr, value: Obj | Inst | None) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        else:  # tuples, attributes, subscripts: what they hold is not tracked
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    self.env[n.id] = None

    # expressions ------------------------------------------------------------------------------
    def expr(self, e: ast.expr) -> Any:
        if isinstance(e, ast.Name):
            return self.env.get(e.id)
        if isinstance(e, ast.Attribute):
            return self.attribute(e)
        if isinstance(e, ast.Call):
            return self.call(e)
        for child in ast.iter_child_nodes(e):  # lists, operators, f-strings, lambdas: check the calls inside
            if isinstance(child, ast.expr):
                self.expr(child)
            elif isinstance(child, ast.comprehension):
                self.expr(child.iter)
                for cond in child.ifs:
                    self.expr(cond)
        return None

    def attribute(self, e: ast.Attribute) -> Any:
        base = self.expr(e.value)
        if isinstance(base, Obj) and _ours(base.value):
            if not hasattr(base.value, e.attr):
                self.fail(e, f"{ast.unparse(e)}: {_name(base.value)} has no attribute {e.attr!r}")
                return None
            return Obj(getattr(base.value, e.attr))
        if isinstance(base, Inst):
            static = inspect.getattr_static(base.cls, e.attr, None)
            if isinstance(static, property) and static.fget is not None:
                return _return_type(static.fget, base.cls)
            if static is not None and callable(getattr(base.cls, e.attr, None)):
                return Obj(_Method(base.cls, e.attr))
            if static is None and _ours(base.cls):
                return _Missing(base.cls, e.attr)
        return None  # instance attributes set by fit (scores_, neurons_): not tracked

    def call(self, e: ast.Call) -> Obj | Inst | None:
        callee = self.expr(e.func)
        if isinstance(callee, _Missing):  # a method the class does not have (not an attribute set by fit)
            self.fail(e, f"{ast.unparse(e.func)}(...): {_name(callee.cls)} has no method {callee.name!r}")
        for a in e.args:
            self.expr(a.value if isinstance(a, ast.Starred) else a)
        for k in e.keywords:
            self.expr(k.value)
        if not isinstance(callee, Obj):
            return None
        target = callee.value
        receiver = None
        if isinstance(target, _Method):
            receiver, target = target.cls, getattr(target.cls, target.name)
        if not _ours(target) or not callable(target):
            return None
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return None
        self.checked += 1
        where = ast.unparse(e)
        if len(where) > 100:
            where = where[:97] + "..."
        # a plain function from the class (an instance method): self is the first positional argument
        unbound = receiver is not None and inspect.isfunction(target)
        placeholders = [None] * (len(e.args) + int(unbound))
        names = [k.arg for k in e.keywords]
        if any(isinstance(a, ast.Starred) for a in e.args) or None in names:
            accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            for n in names:
                if n is not None and n not in sig.parameters and not accepts_any:
                    self.fail(e, f"{where}: {_name(target)}{sig} takes no keyword {n!r}")
        else:
            try:
                sig.bind(*placeholders, **dict.fromkeys(names))
            except TypeError as err:
                self.fail(e, f"{where}: {_name(target)}{sig}: {err}")
                return Inst(target) if inspect.isclass(target) else None  # one problem per call
        if inspect.isclass(target):  # keywords a constructor passes on through **kwargs to its bases
            accepted = _init_keywords(target)
            for n in names:
                if accepted is not None and n is not None and n not in accepted:
                    self.fail(e, f"{where}: neither {_name(target)} nor its base classes take keyword {n!r}")
        if inspect.isclass(target):
            return Inst(target)
        return _return_type(target, receiver)

    def fail(self, node: ast.AST, msg: str) -> None:
        self.problems.append(f"{self.where}, line {getattr(node, 'lineno', '?')} of the block: {msg}")


@dataclass(frozen=True)
class _Missing:
    """``obj.name`` where the class of ``obj`` defines no ``name`` (maybe an instance attribute)."""

    cls: type
    name: str


@dataclass(frozen=True)
class _Method:
    """``obj.method`` on an instance of ``cls`` (resolved on the class)."""

    cls: type
    name: str


def _init_keywords(cls: type) -> set[str] | None:
    """Every keyword ``cls(...)`` accepts, following ``**kwargs`` up the base classes' ``__init__``;
    None when a chain of ``**kwargs`` ends outside capinterp (anything may be accepted)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if "__init__" not in vars(base):
            continue
        if not _ours(base):
            return None
        params = inspect.signature(base.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names
    return None


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def check_markdown(text: str, label: str) -> Checker:
    checker = Checker()
    for i, m in enumerate(BLOCK.finditer(text), 1):
        checker.run(m.group(1), f"{label} block {i}")
    return checker


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if BLOCK.search(f.read_text(encoding="utf-8"))]


# the checker itself ---------------------------------------------------------------------------


def _doc(code: str) -> str:
    return f"text\n\n```python\n{code}\n```\n"


def test_a_keyword_the_function_does_not_take_fails():
    bad = check_markdown(_doc("ds = ci.data.arithmetic(ops='+', n=8, no_such_option=1)"), "t")
    assert bad.checked == 1 and len(bad.problems) == 1 and "no_such_option" in bad.problems[0]
    good = check_markdown(_doc("ds = ci.data.arithmetic(ops='+', n=8, seed=0)"), "t")
    assert good.checked == 1 and good.problems == []


def test_a_keyword_passed_on_through_kwargs_is_followed_to_the_base_classes():
    # CNL(**kwargs) passes checkpoint= and progress= on to its bases; a typo is refused there
    assert check_markdown(_doc("ci.CNL(model, steps=20, checkpoint='x.ckpt', progress=False)"), "t").problems == []
    bad = check_markdown(_doc("ci.CNL(model, steps=20, chekpoint='x.ckpt')"), "t")
    assert len(bad.problems) == 1 and "chekpoint" in bad.problems[0]


def test_too_many_positional_arguments_and_unknown_names_fail():
    assert check_markdown(_doc("ci.metrics.overlap(a, b, c, d, e, f)"), "t").problems
    assert check_markdown(_doc("ci.NoSuchLocalizer(model)"), "t").problems
    assert check_markdown(_doc("from capinterp import no_such_name"), "t").problems


def test_methods_of_tracked_objects_are_checked():
    code = "cnl = ci.CNL(model, steps=20).fit(ds)\ncnl.fit(ds, no_such_option=2)\n"
    checker = check_markdown(_doc(code), "t")
    assert any("no_such_option" in p for p in checker.problems), checker.problems
    loaded = check_markdown(_doc('s = ci.NeuronSet.load("x.capi", no_such_option=m)'), "t")
    assert any("no_such_option" in p for p in loaded.problems), loaded.problems
    # the class method as documented: the keyword must exist on the real signature
    doc = check_markdown(_doc('s = ci.NeuronSet.load("x.capi", model=m)'), "t")
    assert doc.checked == 1


def test_a_method_the_returned_object_does_not_have_fails():
    checker = check_markdown(_doc("base = ci.evaluate(model, ds)\nkept = base.no_such_method()"), "t")
    assert any("no_such_method" in p for p in checker.problems), checker.problems
    assert (
        check_markdown(_doc("base = ci.evaluate(model, ds)\nprint(base.accuracy, base.to_dict())"), "t").problems == []
    )


def test_names_carry_from_one_block_to_the_next_in_a_file():
    text = _doc("res = ci.evaluate(model, ds)") + _doc("res.to_dict(no_such_option=1)")
    assert check_markdown(text, "t").problems


# the documentation ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documented_calls_match_the_real_signatures(path):
    checker = check_markdown(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not checker.problems, "documented calls that do not match the code:\n" + "\n".join(checker.problems)


def test_the_documentation_calls_are_actually_checked():
    total = sum(check_markdown(p.read_text(encoding="utf-8"), "").checked for p in doc_files())
    assert total >= 40, f"only {total} documented calls were resolved: the checker lost track of them"
