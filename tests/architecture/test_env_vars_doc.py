"""docs/env-vars.md and ringtorch/_config.py list the same RINGTORCH_* knobs."""

from __future__ import annotations

import re
from pathlib import Path

from ringtorch import _config

DOC = Path(__file__).resolve().parents[2] / "docs" / "env-vars.md"


def _documented_knobs() -> set[str]:
    return set(re.findall(r"^\| `(RINGTORCH_[A-Z0-9_]+)` \|", DOC.read_text(), flags=re.M))


def test_every_knob_in_config_is_documented() -> None:
    missing = sorted(set(_config.KNOBS) - _documented_knobs())
    assert not missing, f"knobs in _config.py without a row in docs/env-vars.md: {missing}"


def test_every_documented_knob_exists_in_config() -> None:
    stale = sorted(_documented_knobs() - set(_config.KNOBS))
    assert not stale, f"rows in docs/env-vars.md for knobs _config.py does not define: {stale}"


def test_only_config_reads_ringtorch_variables_from_the_environment() -> None:
    package = DOC.parents[1] / "ringtorch"
    readers = []
    for path in package.rglob("*.py"):
        if path.name == "_config.py":
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?\s*[\[(]\s*[\"']RINGTORCH_", text) or re.search(
                r"getenv\(\s*[\"']RINGTORCH_", text):
            readers.append(str(path.relative_to(package.parent)))
    assert not readers, f"modules reading RINGTORCH_* from os.environ directly: {readers}"
