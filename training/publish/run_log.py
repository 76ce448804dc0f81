"""The run's record, `output_dir/metrics.jsonl`: one JSON row per optimizer step, evaluation and final result.
A resumed run drops the rows marked "final" and those beyond its step; a torn last line (a kill mid-append) is
dropped with a warning, while an earlier line that is not JSON stops the resume, naming file and line.
"""

import json
import os

from hf_tinytx.folders.safe import open_new
from hf_tinytx_training.errors import RunError


class RunLog:
    def __init__(self, output_dir: str, accelerator):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.accelerator = accelerator
        self.rows: list[dict] = []

    def start(self, resumed_step: int) -> None:
        """Keeps the rows up to the resumed step (none for a new run) and rewrites the file with them."""
        if resumed_step and os.path.exists(self.path):
            rows = self.read()
            self.rows = [row for row in rows if row["step"] <= resumed_step and not row.get("final")]
        if self.accelerator.is_main_process:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            # a link at either name is replaced, never written through
            with open_new(self.path + ".tmp") as f:
                f.writelines(json.dumps(row) + "\n" for row in self.rows)
            os.replace(self.path + ".tmp", self.path)

    def read(self) -> list[dict]:
        """The rows written so far, without a torn last line."""
        with open(self.path, "rb") as f:
            lines = [(number, line) for number, line in enumerate(f.read().split(b"\n"), 1) if line.strip()]
        rows = []
        for number, line in lines:
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or "step" not in row:
                    raise ValueError("not a row with a step")
                rows.append(row)
            except ValueError as error:
                if number != lines[-1][0]:
                    raise RunError(
                        f"{self.path} line {number} is not a metrics row ({error}); remove or repair that "
                        "line, then resume again."
                    ) from None
                self.accelerator.print(
                    f"Warning: dropped the torn last line {number} of {self.path} (a run stopped while "
                    f"writing it): {line[:60].decode(errors='replace')!r}"
                )
        return rows

    def log(self, row: dict) -> None:
        self.rows.append(row)
        self.accelerator.log({k: v for k, v in row.items() if k not in ("step", "final")}, step=row["step"])
        if self.accelerator.is_main_process:
            with open_new(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def last(self, key: str):
        return next((row[key] for row in reversed(self.rows) if key in row), None)
