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
