"""mkdocs hook: pages that live outside docs/, and the import path the API reference reads.

``bench/RESULTS.md`` (written by the benchmarks) becomes ``results.md`` and
``infra/README.md`` (the Kubernetes recipe, checked by ``tests/test_infra.py``) becomes
``infra.md``, so each has one source. A page links to them by their repository path
(``../bench/RESULTS.md#section``), which works when the Markdown is read on GitHub; here
those links are rewritten to the generated pages, so ``mkdocs build --strict`` still checks
that they and their anchors exist.

The API reference (mkdocstrings, which reads the sources with griffe) needs a ``funnel``
folder to find ``funnel.serving.search``, but the four packages live at the top of the
repository and are mapped under ``funnel`` only by the install (``pyproject.toml``
``package-dir``); griffe does not follow setuptools' editable-install path hook. So the
build makes ``build/docs-api/funnel/<package>`` links to the real folders, the path
``mkdocs.yml`` gives mkdocstrings. Run as the ``mkdocs`` script, Python puts the script's
folder (``.venv/bin``) first on ``sys.path``, where griffe would take the ``funnel`` console
script for a part of the package; the hook drops that folder from the path.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys

from mkdocs.structure.files import File

#: repository path -> page name in the site
PAGES = {"bench/RESULTS.md": "results.md", "infra/README.md": "infra.md"}

_LINK = re.compile(r"\]\(((?:\.\./)+)(" + "|".join(re.escape(p) for p in PAGES) + r")(#[^)\s]*)?\)")


def _repo_root(config) -> str:
    return os.path.dirname(os.path.abspath(config["config_file_path"]))


#: the folders the install maps under ``funnel`` (pyproject.toml [tool.setuptools.package-dir])
PACKAGES = ("pipelines", "jobs", "serving", "evaluation")
API_PATH = os.path.join("build", "docs-api")


def _link_packages(root: str) -> None:
    ns = os.path.join(root, API_PATH, "funnel")
    os.makedirs(ns, exist_ok=True)
    for pkg in PACKAGES:
        link = os.path.join(ns, pkg)
        target = os.path.relpath(os.path.join(root, pkg), ns)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)


# At import, not in on_config: mkdocs imports hooks while it validates the config, before any
# plugin's on_config, and mkdocstrings resolves its ``paths`` in its own on_config, silently
# dropping one that does not exist yet (a fresh clone has no build/).
# The same holds for the ``sys.path`` copy it takes, so the scripts folder is dropped here too.
_link_packages(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_SCRIPTS = os.path.dirname(os.path.abspath(sys.argv[0]))
if os.path.exists(os.path.join(_SCRIPTS, "funnel")):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _SCRIPTS]


def on_config(config):
    _link_packages(_repo_root(config))
    return config


def on_files(files, config):
    root = _repo_root(config)
    for src, name in PAGES.items():
        with open(os.path.join(root, src), encoding="utf-8") as f:
            files.append(File.generated(config, name, content=f.read()))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)
    depth = len([p for p in here.split("/") if p])

    def rewrite(m: re.Match) -> str:
        ups, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if ups.count("../") != depth + 1:  # not a path to the repository root from this page
            return m.group(0)
        return f"]({posixpath.relpath(PAGES[target], here or '.')}{anchor})"

    return _LINK.sub(rewrite, markdown)
