"""The per-user secret file: made once with mode 0600, shared by every process, refused when
other users could read it."""

from __future__ import annotations

import multiprocessing
import os
import re
import stat
from pathlib import Path

import pytest

from ringtorch import _config
from ringtorch._wire import secret_file
from ringtorch._wire.handshake import job_secret
from ringtorch._wire.secret_file import SecretFileError, read_or_create


def test_the_first_use_creates_a_private_file_with_a_random_secret(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".config" / "ringtorch" / "secret"
    secret = read_or_create(str(path))
    assert secret is not None and re.fullmatch(rb"[0-9a-f]{64}", secret)
    assert path.read_bytes() == secret + b"\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["secret"]  # no temporary file left


def test_later_uses_read_the_same_secret(tmp_path: Path) -> None:
    path = str(tmp_path / "secret")
    assert read_or_create(path) == read_or_create(path) == Path(path).read_bytes().strip()


def _race(path: str) -> bytes | None:
    return read_or_create(path)


def test_processes_creating_it_at_once_all_end_with_one_secret(tmp_path: Path) -> None:
    path = str(tmp_path / "dir" / "secret")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        got = pool.map(_race, [path] * 32)
    assert set(got) == {Path(path).read_bytes().strip()}
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["secret"]


def test_a_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("a" * 64)
    path.chmod(0o644)
    with pytest.raises(SecretFileError, match=(
            rf"^the ringtorch secret file {re.escape(str(path))} has mode 0644: other users could "
            rf"read or change the job secret\. Run `chmod 600 {re.escape(str(path))}` \(or remove "
            rf"the file to have a new one made\), or set RINGTORCH_SECRET$")):
        read_or_create(str(path))


def test_a_file_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret"
    path.write_text("a" * 64)
    path.chmod(0o600)
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)
    with pytest.raises(SecretFileError, match=(
            rf"^the ringtorch secret file {re.escape(str(path))} belongs to user id {me}, not to "
            rf"this user \({me + 1}\): remove it, or set RINGTORCH_SECRET$")):
        read_or_create(str(path))


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(SecretFileError, match=(
            rf"^the ringtorch secret file {re.escape(str(path))} is empty: remove it to have a new "
            rf"one made, or set RINGTORCH_SECRET$")):
        read_or_create(str(path))


def test_a_home_that_cannot_be_written_leaves_the_process_without_a_secret(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "home"
    not_a_folder.write_text("a file where the home folder should be")
    path = not_a_folder / ".config" / "ringtorch" / "secret"
    with pytest.warns(UserWarning, match=(
            rf"^ringtorch could not create the per-user secret file {re.escape(str(path))} \(.+\):"
            rf" this process's connections are not authenticated; set RINGTORCH_SECRET to the "
            rf"same value on every process of the job$")):
        assert read_or_create(str(path)) is None


def test_job_secret_prefers_ringtorch_secret_then_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    with _config.override(SECRET="from the environment", SECRET_FILE=str(path)):
        assert job_secret() == b"from the environment"
        assert not path.exists()  # not even created when the variable is set
    with _config.override(SECRET="", SECRET_FILE=str(path)):
        assert job_secret() == path.read_bytes().strip()
    with _config.override(SECRET="", SECRET_FILE=""):
        assert job_secret() is None


def test_the_default_file_lives_in_the_users_config_folder(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RINGTORCH_SECRET_FILE", raising=False)
    assert _config.SECRET_FILE.get() == secret_file.DEFAULT_PATH
    assert secret_file.configured_path() == str(tmp_path / ".config" / "ringtorch" / "secret")
