"""`tent new-plugin NAME DIR`: a transport plugin skeleton that builds, installs and passes the
conformance kit as generated (a same-host CMA transport), for a plugin author to start from.

The files come from ``tent_core/templates/plugin/*.tmpl`` (shipped in the wheel); ``{{name}}``,
``{{package}}``, ``{{dist}}`` and ``{{Class}}`` are replaced.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "templates" / "plugin"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
# template file -> path in the new plugin
_LAYOUT = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "setup.py.tmpl": "setup.py",
    "README.md.tmpl": "README.md",
    "csrc/executor.c.tmpl": "csrc/{{name}}_executor.c",
    "pkg/__init__.py.tmpl": "{{package}}/__init__.py",
    "pkg/plugin.py.tmpl": "{{package}}/plugin.py",
    "pkg/transport.py.tmpl": "{{package}}/transport.py",
    "tests/test_plugin.py.tmpl": "tests/test_{{name}}.py",
}


def check_name(name: str) -> None:
    if not _NAME.match(name) or keyword.iskeyword(name) or name.endswith("_"):
        raise ValueError(
            f"plugin name {name!r} must be a lowercase identifier of at most 31 characters "
            "(letters, digits, '_'; starting with a letter), e.g. 'cma' or 'my_fabric'"
        )


def render(name: str, dest: str | Path) -> list[Path]:
    """Write the skeleton of transport `name` into `dest` (which must not exist or be empty)."""
    check_name(name)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty directory")
    values = {
        "{{name}}": name,
        "{{package}}": f"tent_{name}",
        "{{dist}}": f"tent-{name.replace('_', '-')}",
        "{{Class}}": "".join(part.capitalize() for part in name.split("_")) + "Transport",
    }

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, value)
        return text

    written = []
    for src, out in _LAYOUT.items():
        path = dest / fill(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill((TEMPLATE_DIR / src).read_text()))
        written.append(path)
    return written
