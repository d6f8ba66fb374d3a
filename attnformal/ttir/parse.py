"""A parser of the TTIR that ``triton.compiler`` prints (MLIR's pretty form, with debug locations).

Triton's Python bindings can walk a module but expose neither an operation's location nor its
result types, so the printed text is parsed instead. The grammar is MLIR's: one operation per
line, ``%r = dialect.op operands {attrs} : types loc(#locN)``, regions opened by ``{`` at the end of
a line and closed by a line starting with ``}``. Each op keeps its text after the name; the
interpreter's per-op handler reads its own operands and types from it, so an op this file has
never seen still parses and is refused by name (with its source line) where it is interpreted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LOC_DEF = re.compile(r'^#(loc\d*) = loc\((.*)\)$')
_RESULTS = re.compile(r'^((?:%[\w$.-]+(?::\d+)?)(?:, %[\w$.-]+(?::\d+)?)*) = (.*)$')
_TRAILING_LOC = re.compile(r'\s*loc\((#loc\d*|[^()]*(?:\([^()]*\))?[^()]*)\)\s*$')
_PARAM = re.compile(r'%([\w.]+): ([^,]+?)(?: loc\((?:[^()]|\([^()]*\))*\))?(?:,|$)')  # name, type; its loc skipped
_TRITON_LIBRARY = re.compile(r'/triton/(?:triton_patch/)?language/')  # triton-ascend patches tl in triton_patch/
_FUNC = re.compile(r'^tt\.func (?:public |private )?@(\w+)\((.*)\)(?: -> .*)? (?:attributes \{.*\} )?\{$')


class TTIRSyntaxError(ValueError):
    """The printed IR has a shape this parser does not know (one line, quoted)."""


@dataclass
class Op:
    name: str  # e.g. "arith.addi", "tt.load", "scf.for"
    results: list[str]  # SSA names, "%acc#0" style for multi-result ops
    body: str  # the text after the op name, without the trailing loc
    loc: str  # the source position, "file.py:LINE" (innermost frame, then its call sites)
    regions: list[Region] = field(default_factory=list)
    tail: str = ""  # text after the closing brace of the last region (the generic form's types)


@dataclass
class Region:
    args: list[tuple[str, str]]  # block arguments (name, type) of its one block
    ops: list[Op]


@dataclass
class Function:
    name: str
    params: list[tuple[str, str]]  # (name without %, type text)
    ops: list[Op]


def parse_module(text: str, arg_names: list[str] | None = None) -> Function:
    """The one ``tt.func`` of a lowered kernel (Triton's inliner has folded every helper into it).

    ``arg_names``: the kernel's runtime arguments in order, for a front end that prints them as
    ``%arg0, %arg1, ...`` (Triton 3.2, triton-ascend's); they are renamed to them throughout."""
    lines = text.splitlines()
    locations = _Locations([line for line in lines if line.startswith("#loc")])
    body = [line.strip() for line in lines if line.strip() and not line.startswith("#loc")]
    functions = [i for i, line in enumerate(body) if line.startswith("tt.func")]
    if len(functions) != 1:
        raise TTIRSyntaxError(f"expected one tt.func after inlining, found {len(functions)}")
    start = functions[0]
    match = _FUNC.match(_strip_loc(body[start])[0])
    if not match:
        raise TTIRSyntaxError(f"unrecognised function header: {body[start][:120]}")
    params = _PARAM.findall(match.group(2))
    if arg_names is not None and [name for name, _ in params] == [f"arg{k}" for k in range(len(params))]:
        if len(arg_names) != len(params):
            raise TTIRSyntaxError(f"{len(params)} parameters, {len(arg_names)} argument names")
        params = [(name, type_) for name, (_, type_) in zip(arg_names, params)]
        unnamed = re.compile(r'%arg(\d+)(?![\w$.-])')  # block arguments are numbered after the parameters
        body = [unnamed.sub(lambda m: f"%{arg_names[int(m[1])]}" if int(m[1]) < len(arg_names) else m[0], line)
                for line in body]
    ops, _ = _parse_ops(body, start + 1, locations)
    return Function(match.group(1), params, ops)


def _parse_ops(lines, i, locations):
    ops = []
    while i < len(lines) and not lines[i].startswith("}"):
        op, i = _parse_op(lines, i, locations)
        ops.append(op)
    return ops, i


def _parse_op(lines, i, locations):
    line, loc = _strip_loc(lines[i])
    results, rest = [], line
    match = _RESULTS.match(line)
    if match:
        results, rest = _result_names(match.group(1)), match.group(2)
    if rest.startswith('"'):  # generic form: "tt.reduce"(%x) <{attrs}> ({ ... }) : types
        name, _, body = rest[1:].partition('"')
    else:
        name, _, body = rest.partition(" ")
    op = Op(name, results, body.strip(), locations.resolve(loc))
    i += 1
    if not line.endswith("{"):
        return op, i
    op.body = body[:-1].rstrip()
    while True:  # regions until the closing line carries no further "{"
        args = []
        if i < len(lines) and lines[i].startswith("^bb"):
            args = re.findall(r'(%[\w$.-]+): ([^ ,)]+)', lines[i])
            i += 1
        ops, i = _parse_ops(lines, i, locations)
        op.regions.append(Region([(a.lstrip("%"), t) for a, t in args], ops))
        if i >= len(lines):
            raise TTIRSyntaxError(f"region of {op.name} never closed")
        closing, closing_loc = _strip_loc(lines[i])
        i += 1
        if closing.endswith("{"):
            continue
        if closing_loc and op.loc == "?":
            op.loc = locations.resolve(closing_loc)
        op.tail = closing.lstrip("}) ")
        return op, i


def _result_names(text):
    names = []
    for item in text.split(", "):
        name, _, count = item.partition(":")
        names.extend([f"{name}#{k}" for k in range(int(count))] if count else [name])
    return names


def _strip_loc(line):
    match = _TRAILING_LOC.search(line)
    if not match:
        return line, ""
    return line[:match.start()].rstrip(), match.group(1)


class _Locations:
    """``#locN`` aliases resolved to source frames: ``callsite(callee at caller)`` keeps both."""

    def __init__(self, definitions):
        self.raw = {}
        for line in definitions:
            match = _LOC_DEF.match(line)
            if match:
                self.raw["#" + match.group(1)] = match.group(2)
        self.cache = {}

    def frames(self, text, depth=0):
        if depth > 64:
            return []
        text = text.strip()
        if text.startswith("#loc"):
            if text not in self.cache:
                self.cache[text] = self.frames(self.raw.get(text, "unknown"), depth + 1)
            return self.cache[text]
        file_line = re.match(r'^"([^"]+)":(\d+):\d+$', text)
        if file_line:
            return [(file_line.group(1), int(file_line.group(2)))]
        named = re.match(r'^"[^"]*"\((.*)\)$', text)
        if named:
            return self.frames(named.group(1), depth + 1)
        callsite = re.match(r'^callsite\((#loc\d*) at (#loc\d*)\)$', text)
        if callsite:
            return self.frames(callsite.group(1), depth + 1) + self.frames(callsite.group(2), depth + 1)
        return []

    def resolve(self, text):
        frames = [f for f in (self.frames(text) if text else []) if not _TRITON_LIBRARY.search(f[0])]
        if not frames:  # Triton's own library frames (tl.max's body) say nothing about the kernel
            return "?"
        (file, line), callers = frames[0], [str(n) for _, n in frames[1:]]
        where = f"{file.rsplit('/', 1)[-1]}:{line}"
        return where + (f" (called from line {', '.join(callers)})" if callers else "")


def line_of(loc: str) -> int | None:
    """The innermost source line of a resolved location, or None."""
    match = re.match(r'^[^:]+:(\d+)', loc)
    return int(match.group(1)) if match else None
