"""The server log file: rotation per start, reading what is new, the last lines (sync; small files ops)."""

from __future__ import annotations

from pathlib import Path

KEEP_OLD_LOGS = 5
_TAIL_BYTES = 64 * 1024


def rotate(log_path: Path, keep: int = KEEP_OLD_LOGS) -> None:
    """server.log → server.log.1 → … → server.log.<keep> (the oldest is dropped); makes the folder."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.with_name(f"{log_path.name}.{keep}").unlink(missing_ok=True)
    for i in range(keep - 1, 0, -1):
        older = log_path.with_name(f"{log_path.name}.{i}")
        if older.exists():
            older.rename(log_path.with_name(f"{log_path.name}.{i + 1}"))
    if log_path.exists():
        log_path.rename(log_path.with_name(f"{log_path.name}.1"))


def tail(log_path: Path, n: int = 15) -> list[str]:
    """The last `n` non-empty lines of the file ([] if it does not exist)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
            data = f.read()
    except FileNotFoundError:
        return []
    return [ln.rstrip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()][-n:]


class LogFollower:
    """Reads the complete lines appended to a log since the last call."""

    def __init__(self, log_path: Path):
        self.log_path, self._offset, self._partial = log_path, 0, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        return [ln.decode("utf-8", "replace").rstrip() for ln in complete]

    def all_lines(self) -> list[str]:
        """The whole file's lines (for the capacity cross-check after start-up)."""
        try:
            return self.log_path.read_text("utf-8", "replace").splitlines()
        except FileNotFoundError:
            return []
