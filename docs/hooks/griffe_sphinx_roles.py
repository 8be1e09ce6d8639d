"""Griffe extension: the project's reStructuredText habits in docstrings, as Markdown.

The docstrings are Google style but cross-reference with Sphinx roles
(``:func:`plan```, ``:class:`~autoremat.Plan```, ``:data:`TARGETS```) and introduce code
blocks with ``::``; module constants are documented by ``#:`` comments above them. Here,
before mkdocstrings renders them:

* a role becomes a link to the object when the reference documents it, and plain code
  otherwise (an *optional* autorefs reference: never a broken link, never a warning);
* a line ending in ``text::`` ends in ``text:`` (the indented block after it is already a
  Markdown code block), and a line of ``::`` alone is dropped;
* an entry that documents several names at once (``fn, *args, argnums: as for ...`` in
  ``Args:``, ``a, b: ...`` in ``Attributes:``) becomes one entry per name, as Google style
  has it (griffe warns about the combined name and cannot match it to the signature);
* an attribute without a docstring takes the ``#:`` comment lines right above it.

The source files are not changed.
"""

from __future__ import annotations

import html
import pathlib
import re

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(~?)([\w.]+)(?:\(\))?`")
_LITERAL = re.compile(r"(?<=\S)::[ \t]*$", re.M)
_LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*\n", re.M)


_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Attributes|Other Parameters|"
                      r"Keyword Args|Keyword Arguments):\s*$")
_NAME = re.compile(r"\*{0,2}\w+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_entries(text: str) -> str:
    """Entries of ``Args:``/``Attributes:`` sections naming several names, one per name."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        header = _SECTION.match(lines[i])
        out.append(lines[i])
        i += 1
        if not header:
            continue
        section_indent = len(header.group(1))
        item_indent = None
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > section_indent):
            line = lines[i]
            if not line.strip() or (item_indent is not None and _indent(line) > item_indent):
                out.append(line)
                i += 1
                continue
            item_indent = _indent(line)
            head, j = line.strip(), i + 1
            while (":" not in head and head.endswith(",") and j < len(lines)
                   and _indent(lines[j]) > item_indent):
                head += " " + lines[j].strip()
                j += 1
            names, colon, desc = head.partition(":")
            parts = [n.strip() for n in names.split(",")]
            end = j
            while end < len(lines) and (_indent(lines[end]) > item_indent or (
                    not lines[end].strip() and end + 1 < len(lines)
                    and _indent(lines[end + 1]) > item_indent)):
                end += 1
            if colon and len(parts) > 1 and all(_NAME.fullmatch(n) for n in parts):
                for name in parts:
                    out.append(" " * item_indent + f"{name}:{desc}")
                    out.extend(lines[j:end])
            else:
                out.extend(lines[i:end])
            i = end
    return "\n".join(out)


def _identifier(obj: griffe.Object, target: str) -> str:
    """The full path ``target`` names, seen from ``obj``'s docstring."""
    if target.split(".")[0] in ("autoremat", "autoremat_ilp", "autoremat_solvers"):
        return target
    head, _, rest = target.partition(".")
    scope = obj
    while scope is not None:
        if head in scope.members:
            member = scope.members[head]
            full = member.target_path if member.is_alias else member.path
            return f"{full}.{rest}" if rest else full
        scope = scope.parent
    try:
        full = obj.resolve(head)
    except Exception:  # not a name of this module: leave it as written
        return target
    return f"{full}.{rest}" if rest else full


def convert(text: str, obj: griffe.Object) -> str:
    """``text`` with roles as optional references and ``::`` as ``:``."""

    def role(match: re.Match) -> str:
        short, target = match.groups()
        title = target.rsplit(".", 1)[-1] if short else target
        identifier = html.escape(_identifier(obj, target), quote=True)
        return (f'<autoref identifier="{identifier}" optional>'
                f'<code>{html.escape(title)}</code></autoref>')

    text = _ROLE.sub(role, split_entries(text))
    text = _LONE_LITERAL.sub("", text)
    return _LITERAL.sub(":", text)


def _comment_doc(attr: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines right above an attribute's assignment."""
    if not attr.filepath or not attr.lineno or isinstance(attr.filepath, list):
        return None
    lines = pathlib.Path(attr.filepath).read_text(encoding="utf-8").splitlines()
    found = []
    k = attr.lineno - 2
    while k >= 0 and lines[k].lstrip().startswith("#:"):
        found.append(lines[k].lstrip()[2:].strip())
        k -= 1
    return " ".join(reversed(found)) or None


class SphinxRoles(griffe.Extension):
    """See the module docstring."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        self._visit(pkg, loader)

    def _visit(self, obj: griffe.Object, loader: griffe.GriffeLoader) -> None:
        if obj.is_attribute and obj.docstring is None:
            text = _comment_doc(obj)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj,
                                                 parser=loader.docstring_parser,
                                                 parser_options=loader.docstring_options)
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value, obj)
        for member in obj.members.values():
            if not member.is_alias:
                self._visit(member, loader)
