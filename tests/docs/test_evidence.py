"""docs/evidence/: every entry is complete, the copy compiled into _core is the files on disk, and
every id cited in the code, the docs and the built-in profiles' reasons exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastcopy import _core

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
FIELDS = ("claim", "figures", "machine", "date", "command")
ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

GOOD = """# Evidence: example

Introduction.

## one-entry
- Claim: a claim.
- Figures: 1.2x at 4 KiB;
  more figures.
- Machine: AMD EPYC family 25 model 1 (Zen 3).
- Date: 2026-11-30
- Command: `kernel_bench --sizes 4K`
"""


def files_on_disk() -> dict:
    return {p.stem: p.read_text() for p in sorted(EVIDENCE.glob("*.md")) if p.name != "README.md"}


def joined_source(text: str) -> str:
    """Source text with split string literals and continued // comments joined, so that a
    citation broken over two lines reads as one."""
    text = re.sub(r'"\s*\n\s*"', "", text)
    return re.sub(r"\n\s*(//|#)\s*", " ", text)


def cited_in_tree() -> dict:
    cited: dict = {}
    paths = [*(ROOT / "cpp").rglob("*.h"), *(ROOT / "cpp").rglob("*.cpp"), *(ROOT / "src").rglob("*.py"),
             *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    for path in sorted(paths):
        for ident in _core.evidence_cited(joined_source(path.read_text(errors="replace"))):
            cited.setdefault(ident, str(path.relative_to(ROOT)))
    return cited


def test_compiled_evidence_is_the_files_on_disk():
    """The module carries the evidence files as they are (rebuild after editing one)."""
    disk = files_on_disk()
    assert disk, "no docs/evidence/<subject>.md"
    compiled = _core.evidence_files()
    changed = sorted(k for k in set(disk) | set(compiled) if disk.get(k) != compiled.get(k))
    assert not changed, f"docs/evidence/{changed}.md differ from the copy in _core: rebuild (tools/dev_build.sh)"


def test_every_entry_has_all_five_fields():
    assert _core.evidence_problems() == []
    entries = _core.evidence()
    assert len(entries) >= 40
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        assert ID.match(e["id"]), e["id"]
        assert e["subject"] in files_on_disk()
        for field in FIELDS:
            assert e[field].strip(), (e["id"], field)


def test_the_reader_finds_each_kind_of_problem():
    assert _core.evidence_check("x", GOOD) == []
    cases = {
        "no Date": GOOD.replace("- Date: 2026-11-30\n", ""),
        "out of order": GOOD.replace("- Machine: AMD EPYC family 25 model 1 (Zen 3).\n- Date: 2026-11-30\n",
                                     "- Date: 2026-11-30\n- Machine: AMD EPYC family 25 model 1 (Zen 3).\n"),
        "kebab-case": GOOD.replace("## one-entry", "## One_Entry"),
        "repeated": GOOD + GOOD[GOOD.index("## one-entry"):],
        "not one of the fields": GOOD.replace("- Date:", "- When:"),
        "text outside a field": GOOD.replace("  more figures.", "more figures."),
        "no Claim": GOOD.replace("- Claim: a claim.", "- Claim:"),
    }
    for words, text in cases.items():
        problems = _core.evidence_check("x", text)
        assert problems and any(words in p for p in problems), (words, problems)


def test_citations_are_read_as_written():
    assert _core.evidence_cited("x (evidence: a-b, c) y; evidence: d. evidence: a-b") == ["a-b", "c", "d"]
    assert _core.evidence_cited("no citation: evidence:` here") == []


def test_every_id_cited_in_the_tree_exists():
    known = {e["id"] for e in _core.evidence()}
    cited = cited_in_tree()
    assert len(cited) >= 30, "the scan for citations found almost nothing: it is broken"
    missing = {i: where for i, where in cited.items() if i not in known}
    assert not missing, f"cited but not in docs/evidence: {missing}"


def builtin_texts(table: dict) -> list:
    texts = [table["parallel"]["why"], table["provenance"]["method"], *table["notes"]]
    for region in table["regions"].values():
        for key, value in region.items():
            if isinstance(value, list):
                texts += [b["why"] for b in value]
            elif isinstance(value, str):
                texts.append(value)
    texts += [e["why"] for e in table["nt"]["examples"]]
    return texts


@pytest.mark.parametrize("name", [t["name"] for t in _core.builtin_profile_table()])
def test_builtin_reasons_are_short_and_cite_existing_evidence(name):
    """A built-in reason obeys the length limit a profile file has, and every id it cites exists."""
    table = next(t for t in _core.builtin_profile_table() if t["name"] == name)
    known = {e["id"] for e in _core.evidence()}
    limit = _core.profile_limits()["max_why_chars"]
    for text in builtin_texts(table):
        assert len(text) <= limit, (name, len(text), text)
        for ident in _core.evidence_cited(text):
            assert ident in known, (name, ident)
