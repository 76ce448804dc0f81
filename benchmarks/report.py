"""How a benchmark ends: a table for the reader (name | value), then the whole result as one JSON line, last,
for scripts and benchmarks/results/ to keep."""

import json


def print_report(rows: list[tuple[str, str]], result: dict, out: str | None = None) -> None:
    """`out`: also write the result there, indented, for benchmarks/results/."""
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(result, indent=1) + "\n")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}} | {value}")
    print(json.dumps(result))
