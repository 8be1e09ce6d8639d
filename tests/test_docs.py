"""The documentation site builds in strict mode, and its pages say what they must.

The site is built once, as its documented command does (``mkdocs build --strict``, from the
repository root), into a temporary folder; the checks then parse the built HTML.
"""

from __future__ import annotations

import ast
import html.parser
import os
import pathlib
import re
import subprocess
import sys
import urllib.parse

import pytest

for _module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python",
                "mkdocs_jupyter"):
    pytest.importorskip(_module, reason='the docs tools: pip install -e ".[docs]"')

ROOT = pathlib.Path(__file__).resolve().parent.parent


class _Page(html.parser.HTMLParser):
    """Ids, image sources, link targets and the text of each ``<pre>`` block of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.images: list[str] = []
        self.links: list[str] = []
        self.blocks: list[str] = []
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "pre":
            self._pre += 1
            self.blocks.append("")

    def handle_endtag(self, tag):
        if tag == "pre" and self._pre:
            self._pre -= 1

    def handle_data(self, data):
        if self._pre:
            self.blocks[-1] += data


def _parse(path: pathlib.Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _readme_commands() -> list[str]:
    """The commands of the README's "The two commands" section (as .ci/readme_commands.py)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def _public_names(source: str) -> list[str]:
    """A module's literal ``__all__``, read from its source."""
    tree = ast.parse((ROOT / source).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{source} has no literal __all__")


def _target(page: pathlib.Path, ref: str, site: pathlib.Path) -> pathlib.Path | None:
    """The built file a relative link or image source of ``page`` names (``None`` for
    external links, links within the page, and absolute paths, which only the 404 page has:
    they depend on where the site is served)."""
    parts = urllib.parse.urlsplit(ref)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    target = (page.parent / urllib.parse.unquote(parts.path)).resolve()
    if target.is_dir():
        target = target / "index.html"
    assert site.resolve() in target.parents, f"{page}: {ref} leaves the site"
    return target


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "solvers"), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_getting_started_has_the_two_commands_and_a_picture(site):
    path = site / "getting-started" / "index.html"
    page = _parse(path)
    commands = _readme_commands()
    assert len(commands) == 2
    blocks = [b.strip() for b in page.blocks]
    for command in commands:
        assert command in blocks, f"{command!r} is not a code block of the getting-started page"
    assert page.images, "no picture on the getting-started page"
    for src in page.images:
        target = _target(path, src, site)
        assert target is not None and target.is_file() and target.stat().st_size > 0, src


@pytest.mark.parametrize(("page", "source", "module"), [
    ("autoremat", "autoremat/__init__.py", "autoremat"),
    ("zoo", "autoremat/zoo/__init__.py", "autoremat.zoo"),
    ("solvers", "solvers/autoremat_solvers/__init__.py", "autoremat_solvers"),
    ("ilp", "solvers/autoremat_ilp/__init__.py", "autoremat_ilp"),
])
def test_every_public_name_is_in_the_reference(site, page, source, module):
    ids = _parse(site / "reference" / page / "index.html").ids
    missing = [n for n in _public_names(source) if f"{module}.{n}" not in ids]
    assert not missing, f"not in the {module} reference: {missing}"


def test_the_reference_follows_the_imported_all(site):
    import autoremat

    ids = _parse(site / "reference" / "autoremat" / "index.html").ids
    assert {f"autoremat.{n}" for n in autoremat.__all__} <= ids


def test_the_command_line_page_has_every_help(site):
    text = (site / "how-to" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("", " demo", " plan", " report", " bench"):
        assert f"Usage: autoremat{command} [OPTIONS]" in text, command


def test_integrations_are_in_the_reference(site):
    ids = _parse(site / "reference" / "integrations" / "index.html").ids
    for name in ("flax_nnx.optimize", "flax_nnx.plan", "flax_nnx.apply", "equinox.optimize",
                 "equinox.plan", "equinox.apply", "optax.TrainStep"):
        assert f"autoremat.integrations.{name}" in ids, name


@pytest.mark.parametrize("name", ["quickstart", "research"])
def test_notebook_pages_exist(site, name):
    import json

    path = site / "notebooks" / name / "index.html"
    assert path.is_file()
    text = path.read_text(encoding="utf-8")
    notebook = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    first_code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    line = next(s for s in "".join(first_code["source"]).splitlines() if s.strip())
    assert line.split()[-1] in text  # the notebook's code is on the page


def test_bench_results_are_served(site):
    for pattern in ("bench/results/*.md", "bench/results/*.png",
                    "solvers/bench/results/*.md", "solvers/bench/results/*.png"):
        for path in ROOT.glob(pattern):
            rel = path.relative_to(ROOT)
            built = (site / rel.with_suffix("") / "index.html" if path.suffix == ".md"
                     else site / rel)
            if path.name == "README.md":
                built = site / rel.parent / "index.html"
            assert built.is_file(), f"{rel} is not in the site"


def test_internal_links_and_images_resolve(site):
    broken = []
    for path in site.rglob("*.html"):
        page = _parse(path)
        for ref in page.links + page.images:
            target = _target(path, ref, site)
            if target is not None and not target.exists():
                broken.append(f"{path.relative_to(site)}: {ref}")
    assert not broken, "\n".join(broken[:20])


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    refs = re.findall(r"\]\(([^)\s]+)\)", text)
    assert refs
    missing = [r for r in refs if not urllib.parse.urlsplit(r).scheme
               and not (ROOT / r.split("#")[0]).exists()]
    assert not missing, missing


def test_the_first_plan_prints_what_the_page_shows(capsys):
    """The getting-started page's first plan, run: its report's figures and rows are the
    page's (the solver's time aside)."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    section = page[page.index("## A first plan"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"which printed.*?```text\n(.*?)```", section, re.S)
    assert code and shown
    source = code.group(1).replace("grads = jax.jit", "# grads = jax.jit")
    exec(compile(source, "first_plan.py", "exec"), {})
    printed = capsys.readouterr().out
    steady = lambda text: [line for line in text.splitlines() if not line.startswith("solver")]
    assert steady(printed) == steady(shown.group(1))
