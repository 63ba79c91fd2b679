"""One module per table of `make eval`'s report: each computes its figures
and renders them as markdown. `models/evaluate.py` runs them in order."""


def cell(value: object, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else fmt.format(value)
