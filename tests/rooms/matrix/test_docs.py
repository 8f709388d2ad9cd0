"""docs/matrix.md's example runs as written (so the prose cannot drift from the code)."""
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "matrix.md"


def test_the_using_it_example_runs():
    text = DOC.read_text()
    block = text.split("## Using it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, str(DOC), "exec"), {})
