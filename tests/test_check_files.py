"""Check files are read by users (issue 52): what a check gates and where its limits come from, not the history of
how they were measured. Every check file — the shipped ones (checks/, checks/gpu/) and the benchmarks' own
(benchmarks/checks/) — holds at most a third of its lines as comments; the figures live in benchmarks/RESULTS.md,
the derivations in docs/gates.md ("The shipped limits") and benchmarks/results/limit_derivations.json."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK_FILES = sorted([*ROOT.glob("checks/*.yaml"), *ROOT.glob("checks/gpu/*.yaml"), *ROOT.glob("benchmarks/checks/*.yaml")])
MAX_COMMENT_SHARE = 1 / 3


def comment_lines(text: str) -> tuple[int, int]:
    """(lines that are or carry a comment, all lines) of a YAML text; a `#` inside quotes is not a comment.

    >>> comment_lines('# a\\nname: x  # b\\nurl: "http://h/#frag"\\n')
    (2, 3)
    """
    lines = text.splitlines()
    return sum(_has_comment(line) for line in lines), len(lines)


def _has_comment(line: str) -> bool:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return True
    return False


def test_the_check_files_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in CHECK_FILES}
    assert {"checks/fp8_kvfp16.yaml", "checks/gpu/fp8_kvfp16.yaml", "benchmarks/checks/int8_sq_fallback.yaml"} <= names


@pytest.mark.parametrize("path", CHECK_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_check_file_is_at_most_a_third_comments(path: Path) -> None:
    comments, lines = comment_lines(path.read_text(encoding="utf-8"))
    assert comments <= MAX_COMMENT_SHARE * lines, f"{path.relative_to(ROOT)}: {comments} of {lines} lines are comments"


def test_the_rule_sees_a_file_of_comments() -> None:
    assert comment_lines("# what it gates\n# why\nname: x\n") == (2, 3)  # 2 > 3 / 3: fails the rule
    assert comment_lines("# what it gates\nname: x\nseed: 0\n") == (1, 3)  # passes it
    assert comment_lines("a: 'x # y'\nb: 1 # c\n") == (1, 2)
