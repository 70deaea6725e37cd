"""pytest imports test modules by basename (rootdir-less layout): two files of one name stop its collection."""

from collections import Counter
from pathlib import Path


def test_test_module_names_are_unique_across_tests():
    names = Counter(p.name for p in Path(__file__).parent.parent.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]
