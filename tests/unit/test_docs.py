"""The reference text in README.md and docs/ is rendered from the code's definitions."""

import re

from daskprobe.dashboards import reference
from daskprobe.probes import rates


def test_generated_blocks_match_the_definitions():
    for name in reference.FILES:
        text = (reference.ROOT / name).read_text()
        assert reference.BLOCK.search(text), f"{name} has no generated block"
        assert reference.render(text) == text, (
            f"{name} differs from the definitions: run python -m daskprobe.dashboards.reference")


def test_a_changed_definition_is_caught(monkeypatch):
    text = (reference.ROOT / "docs/attribution.md").read_text()
    monkeypatch.setitem(reference.BLOCKS, "categories", lambda: "| `compute` | something else |\n")
    assert reference.render(text) != text


def test_the_json_files_pages_are_their_definitions():
    for name, page in reference.PAGES.items():
        assert (reference.ROOT / name).read_text() == page(), (
            f"{name} differs from its definitions: run python -m daskprobe.dashboards.reference")


def test_run_page_says_the_default_rates():
    rows = {line.split("`")[1].split()[0]: line for line in
            (reference.ROOT / "docs/run.md").read_text().splitlines() if line.startswith("| `--")}
    assert f"(default {rates.SAMPLE_RATE:g})" in rows["--sample-rate"]
    assert f"default is {rates.PYSPY_SAMPLE_RATE:g} where py-spy" in rows["--sample-rate"]
    assert f"(default {rates.CPU_HZ:g})" in rows["--cpu-hz"]


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_docs_resolve():
    pages = [reference.ROOT / "README.md", *sorted((reference.ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), flags=re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{page.name}: {target}")
    assert not broken, broken


def test_measurements_is_a_dated_log():
    headings = re.findall(r"^## (.*)$", (reference.ROOT / "docs/measurements.md").read_text(), flags=re.M)
    assert headings
    undated = [h for h in headings if not re.match(r"\d{4}-\d\d-\d\d: \S", h)]
    assert not undated, f"measurements.md entries go under ## YYYY-MM-DD: topic: {undated}"


def _sentences(text: str) -> list[int]:
    """Words per sentence of a page's prose: code blocks, tables and headings left out; a list item ends one."""
    words, paragraph = [], []

    def end_paragraph():
        for sentence in re.split(r"(?<=[.!?])[)\"']?\s+(?=[A-Z`(\[*\"'0-9])", " ".join(paragraph)):
            if sentence.split():
                words.append(len(sentence.split()))
        paragraph.clear()

    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("|", "#", "<!--")) or re.match(r"([-*]|\d+\.)\s", line):
            end_paragraph()
            line = re.sub(r"^([-*]|\d+\.)\s+", "", line) if not line.startswith(("|", "#", "<!--")) else ""
        if line:
            paragraph.append(line)
    end_paragraph()
    return words


def test_the_user_docs_sentences_are_short():
    # py-spy's and memray's docs run about 17 words a sentence; ours ran 20 (a sixth over 40) before issue 40
    words = [n for page in sorted((reference.ROOT / "docs").glob("*.md")) if page.name != "measurements.md"
             for n in _sentences(page.read_text())]
    words.sort()
    assert words[len(words) // 2] <= 17, f"median sentence {words[len(words) // 2]} words"
    assert sum(n > 40 for n in words) <= 0.05 * len(words), f"{sum(n > 40 for n in words)} of {len(words)} over 40 words"
