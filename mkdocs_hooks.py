"""mkdocs hooks: the API pages list every public name, and a public name without a docstring fails the build.

An API page names a module instead of its members: the line `<!-- api: MODULE -->` becomes one
`::: MODULE.NAME` entry (rendered by mkdocstrings from the docstring) per name of `MODULE.__all__`
that is not itself a module, so a name added to an `__all__` gets its entry without editing the page.
Forms: `<!-- api: MODULE except OTHER -->` leaves out the names of `OTHER.__all__`,
`<!-- api: MODULE only OTHER -->` keeps only those, `<!-- api: MODULE names A B -->` lists them.
A function or class among them without a docstring is a warning, so `mkdocs build --strict` fails;
tests/test_docs.py checks that every argument is documented.
"""

import importlib
import inspect
import logging
import re

log = logging.getLogger("mkdocs.plugins.keras_vit_api")
MARKER = re.compile(r"^<!-- api: ([\w.]+)(?: (except|only|names) ([\w. ]+))? -->$", re.M)


def _all(module):
    return list(importlib.import_module(module).__all__)


def public_names(module, how=None, what=None):
    """The names a marker documents, in the order of the module's `__all__` (or of `names`)."""
    mod = importlib.import_module(module)
    if how == "names":
        names = what.split()
    elif how == "only":
        names = _all(what.strip())
    else:
        skip = set(_all(what.strip())) if how == "except" else set()
        names = [n for n in mod.__all__ if n not in skip]
    return [n for n in names if not inspect.ismodule(getattr(mod, n))]


def markers(markdown):
    """(module, how, what) of every marker of a page."""
    return [m.groups() for m in MARKER.finditer(markdown)]


def on_page_markdown(markdown, page, **kwargs):
    def entries(match):
        module, how, what = match.groups()
        lines = []
        for name in public_names(module, how, what):
            obj = getattr(importlib.import_module(module), name)
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and not inspect.getdoc(obj):
                log.warning("%s: the public name %s.%s has no docstring", page.file.src_path, module, name)
            lines.append(f"::: {module}.{name}\n")
        return "\n".join(lines)

    return MARKER.sub(entries, markdown)
