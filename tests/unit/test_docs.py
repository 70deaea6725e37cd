"""The reference text in README.md and docs/ is rendered from the code's definitions."""

from daskprobe.dashboards import reference


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
