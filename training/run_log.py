"""The run's record, `output_dir/metrics.jsonl`: one JSON row per optimizer step, evaluation and final result.

Rows of the final evaluation carry "final": true, so a resumed run can drop them and log its own once; rows beyond
the step a run resumes from (logged by a run that died before its next checkpoint) are dropped too.
"""

import json
import os


class RunLog:
    def __init__(self, output_dir: str, accelerator):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.accelerator = accelerator
        self.rows: list[dict] = []

    def start(self, resumed_step: int) -> None:
        """Keeps the rows up to the resumed step (none for a new run) and rewrites the file with them."""
        if resumed_step and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            self.rows = [row for row in rows if row["step"] <= resumed_step and not row.get("final")]
        if self.accelerator.is_main_process:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in self.rows)
            os.replace(self.path + ".tmp", self.path)

    def log(self, row: dict) -> None:
        self.rows.append(row)
        self.accelerator.log({k: v for k, v in row.items() if k not in ("step", "final")}, step=row["step"])
        if self.accelerator.is_main_process:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def last(self, key: str):
        return next((row[key] for row in reversed(self.rows) if key in row), None)
