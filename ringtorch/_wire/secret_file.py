"""The per-user secret file: the job secret of processes started without RINGTORCH_SECRET.

Every ringtorch process (launcher, workers, ranks started by hand, a store server) that has no
RINGTORCH_SECRET reads its secret from one file of the user's, ``~/.config/ringtorch/secret``
by default (RINGTORCH_SECRET_FILE), and the first process to need it creates it. Nodes that
share a home directory (the usual cluster set-up) therefore share the secret: a multi-node
job, or ranks started by hand on several hosts, authenticate every connection with no set-up.
Nodes that do not share it hold different secrets and fail at the handshake with a message
saying to copy the file or set RINGTORCH_SECRET.

Rules kept: the file is created atomically with mode 0600 (written in full under a temporary
name, then linked into place, which fails rather than replaces when another process won the
race, so every process ends up with the same secret); a file that other users could read or
write, or that belongs to another user, is refused with an error, never used; a home that
cannot be written leaves the process without a secret (a warning says so), as before the file
existed.
"""

from __future__ import annotations

import os
import secrets
import stat
import warnings

from ringtorch import _config

DEFAULT_PATH = "~/.config/ringtorch/secret"


class SecretFileError(PermissionError):
    """The secret file exists but must not be used (mode, owner or content); the message
    says what to do."""


def configured_path() -> str | None:
    """The secret file's path (user and ``~`` expanded), or None when it is turned off
    (RINGTORCH_SECRET_FILE set to the empty string)."""
    path = _config.SECRET_FILE.get()
    return os.path.expanduser(path) if path else None


def read_or_create(path: str) -> bytes | None:
    """The secret stored at ``path``, creating the file (mode 0600) when it does not exist.

    Returns:
        The secret, or None when the file does not exist and cannot be created (a read-only
        or missing home directory); a warning then says connections are unauthenticated.

    Raises:
        SecretFileError: the file is readable or writable by other users, belongs to another
            user, or holds no secret.
    """
    try:
        return _read(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # not made yet (or no home folder): make it
    try:
        _create(path)
    except OSError as exc:
        warnings.warn(
            f"ringtorch could not create the per-user secret file {path} ({exc.strerror or exc}):"
            f" this process's connections are not authenticated; set RINGTORCH_SECRET to the "
            f"same value on every process of the job", stacklevel=3)
        return None
    return _read(path)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise SecretFileError(
                f"the ringtorch secret file {path} belongs to user id {info.st_uid}, not to this "
                f"user ({os.getuid()}): remove it, or set RINGTORCH_SECRET")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise SecretFileError(
                f"the ringtorch secret file {path} has mode {stat.S_IMODE(info.st_mode):04o}: "
                f"other users could read or change the job secret. Run `chmod 600 {path}` "
                f"(or remove the file to have a new one made), or set RINGTORCH_SECRET")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if not data:
        raise SecretFileError(f"the ringtorch secret file {path} is empty: remove it to have a "
                              f"new one made, or set RINGTORCH_SECRET")
    return data


def _create(path: str) -> None:
    """Write a fresh secret to a private temporary file beside ``path`` and link it into
    place; a process that finds ``path`` already there keeps the one that was there."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    temporary = os.path.join(folder, f".secret-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process made it first: every process uses that one
    finally:
        os.unlink(temporary)


__all__ = ["DEFAULT_PATH", "SecretFileError", "configured_path", "read_or_create"]
