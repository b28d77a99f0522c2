"""Where `generate`'s log records go (the only place that configures logging): stdout, INFO and up but the
journal's, above tqdm's bar; each dataset's run.log (UTC), INFO and up about that dataset or about none."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

from gen_pipeline.display import reader_gone, to_devnull

RUN_LOG_NAME = "run.log"
_ROOT = "gen_pipeline"
_JOURNAL = "gen_pipeline.journal"


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A console whose reader may go (`generate ... | tee log`, Ctrl-C; a closed terminal): then silent,
    never a traceback."""

    def handleError(self, record: logging.LogRecord) -> None:
        if reader_gone(sys.exc_info()[1]):
            to_devnull(self.stream)
            return
        super().handleError(record)


def _of_dataset(name: str) -> Callable[[logging.LogRecord], bool]:
    """Records about `name` or about no dataset."""
    return lambda record: getattr(record, "dataset", name) == name


@contextmanager
def console_events(*, bar: bool) -> Iterator[None]:
    """The `gen_pipeline` logger's events on stdout (above the bar when `bar`), INFO and up."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    logger = logging.getLogger(_ROOT)
    handler = _ConsoleHandler(sys.stdout)
    handler.setLevel(logging.INFO)
    handler.addFilter(lambda record: not record.name.startswith(_JOURNAL))
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        if bar:
            with logging_redirect_tqdm([logger]):
                yield
        else:
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def run_logs(folders: Mapping[str, Path]) -> Iterator[None]:
    """Each dataset's records appended to folder/run.log while inside ({dataset name: its folder})."""
    logger = logging.getLogger(_ROOT)
    formatter = logging.Formatter("%(asctime)s.%(msecs)03dZ %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    with ExitStack() as stack:
        for name, folder in folders.items():
            handler = logging.FileHandler(folder / RUN_LOG_NAME, mode="a", encoding="utf-8", delay=True)
            handler.setLevel(logging.INFO)
            handler.setFormatter(formatter)
            handler.addFilter(_of_dataset(name))
            logger.addHandler(handler)
            stack.callback(handler.close)
            stack.callback(logger.removeHandler, handler)
        yield


def quiet_datasets() -> None:
    """The `datasets` library's progress bars and info logs off: the check and the summary report what
    a command read (set before it is imported, it reads them from the environment)."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    logging.getLogger("datasets").setLevel(logging.ERROR)
    if "datasets" in sys.modules:  # already imported (a caller in the same process)
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
