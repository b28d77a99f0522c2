"""The exceptions gen_pipeline raises on purpose.

    GenPipelineError            anything the CLI turns into a message and an exit code
     ├── ConfigError            a dataset/server TOML, a flag or an input file is wrong   (exit 2)
     ├── SourceShortError       the source has fewer valid rows than the target asks for  (exit 5)
     ├── ServerError            the inference server could not be started/reached/kept up (exit 3)
     │    └── ServerStartupError  it exited or never answered /health during start-up
     ├── StoreError             the output folder cannot be used as asked                 (exit 4)
     │    ├── LockedError         another run holds the dataset's lock
     │    ├── ConfigDriftError    the outputs were written with a different config
     │    └── DiskError           a write failed (ENOSPC, EIO); committed data is intact
     └── RequestError           one request failed for good (becomes a Failure record, never escapes a run)

Messages are sentences a user can act on; the CLI prints `str(exc)` without a traceback.
"""

from __future__ import annotations


class GenPipelineError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1


class ConfigError(GenPipelineError):
    exit_code = 2


class SourceShortError(GenPipelineError):  # raised by `check`, and by `generate` before it launches
    exit_code = 5


class ServerError(GenPipelineError):
    exit_code = 3


class ServerStartupError(ServerError):
    pass


class StoreError(GenPipelineError):
    exit_code = 4


class LockedError(StoreError):
    pass


class ConfigDriftError(StoreError):
    pass


class DiskError(StoreError):
    pass


class RequestError(GenPipelineError):
    """A request that will not succeed by retrying; `retryable` marks ones a later run may retry;
    `attempts` is how many were made."""

    def __init__(self, message: str, *, reason: str, retryable: bool = True, attempts: int = 1):
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable
        self.attempts = attempts


def first_known(group: BaseExceptionGroup) -> BaseException:
    """Task groups wrap errors in groups: surface our own error (the CLI has a message for it)."""
    matched: BaseException | None = group.split(GenPipelineError)[0]
    while isinstance(matched, BaseExceptionGroup):
        matched = matched.exceptions[0]
    return matched if matched is not None else group
