"""Progress bars for long work (rich), and a silent stand-in for tests and libraries."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


class Progress:
    """`with progress.task("calibrating", total=64) as advance: advance(1)`."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._rich = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            console = Console(stderr=True)
            self._rich = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
                disable=not console.is_terminal,
            )

    def log(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._rich is None or self._rich.disable:
            self.log(f"{description} ({total})")
            yield lambda n=1: None
            return
        with self._rich:
            tid = self._rich.add_task(description, total=total)
            yield lambda n=1: self._rich.advance(tid, n)


SILENT = Progress(enabled=False)
