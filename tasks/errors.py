"""The one exception type for bad task input files."""

from __future__ import annotations

from typing import Optional


class DataError(ValueError):
    """A task file is malformed; the message names the file, the line, the field and what was expected."""

    def __init__(self, path: str, line: Optional[int], message: str, field: Optional[str] = None):
        self.path, self.line, self.field = path, line, field
        where = str(path) + (f", line {line}" if line is not None else "")
        what = f"field {field!r}: " if field is not None else ""
        super().__init__(f"{where}: {what}{message}")
