"""Nothing unverified reaches users: each device feature named as confirmed in
ringtorch/_device/confirmed.py names a run that docs/gpu.md records, with the device, date,
command, versions and counts; and until the NCCL backend is confirmed, NCCL stays unavailable
to users."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ringtorch._device import confirmed

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"
FIELDS = ("device:", "date:", "command:", "versions:", "counts:")


def _recorded_runs(text: str) -> dict[str, str]:
    """Run id -> its subsection's text, under "## Recorded runs"."""
    section = text.split("\n## Recorded runs\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### (.+)$", section, flags=re.M)
    return {name.strip(): body for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _unrecorded(features: tuple[confirmed.Feature, ...], text: str) -> list[str]:
    runs = _recorded_runs(text)
    problems = []
    for feature in features:
        if feature.confirmed_by is None:
            continue
        body = runs.get(feature.confirmed_by)
        if body is None:
            problems.append(f"{feature.name}: run {feature.confirmed_by!r} is not recorded")
            continue
        missing = [field for field in FIELDS if not re.search(rf"^{field}\s*\S", body, re.M)]
        if missing:
            problems.append(f"{feature.name}: run {feature.confirmed_by!r} lacks {missing}")
    return problems


def test_every_confirmed_feature_names_a_recorded_run() -> None:
    assert _unrecorded(confirmed.FEATURES, DOC.read_text()) == []


def test_a_feature_naming_a_run_the_page_does_not_record_is_caught() -> None:
    planted = (confirmed.Feature("cuda_runtime", "", confirmed_by="2026-12-01-h100"),)
    assert _unrecorded(planted, DOC.read_text()) == [
        "cuda_runtime: run '2026-12-01-h100' is not recorded"]
    page = DOC.read_text() + "\n### 2026-12-01-h100\ndevice: H100\ndate: 2026-12-01\n"
    assert _unrecorded(planted, page) == [
        "cuda_runtime: run '2026-12-01-h100' lacks ['command:', 'versions:', 'counts:']"]


def test_an_unknown_feature_is_an_error() -> None:
    with pytest.raises(KeyError, match="no device feature named 'nccl'; known: cuda_runtime"):
        confirmed.confirmed("nccl")


def test_users_see_no_gpu_behaviour_until_it_is_confirmed() -> None:
    import ringtorch.distributed as dist

    if not confirmed.confirmed("nccl_backend"):
        assert dist.is_nccl_available() is False
