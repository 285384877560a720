"""Reading a subprocess's output line by line while it runs, and waiting for a line."""

import queue
import subprocess
import threading
import time


class OutputLines:
    """Collects every line `process` prints (stdout, with stderr merged into it by the caller)."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self._new_lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._collect, args=(process,), daemon=True).start()

    def _collect(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line)
            self._new_lines.put(line)
        self._new_lines.put(None)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 90) -> str:
        """The first line from now on containing `text`; fails with all output so far if none comes in time."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._new_lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in time; output so far:\n{self.text}")
