"""spec/dump.py's YAML, as the importers and the Kubernetes render write it: whatever text a
value holds, loading the YAML gives that text back (YAML folds its other line breaks,
U+0085, U+2028, U+2029 and a lone \\r, into a space or a newline unless they are escaped)."""

from __future__ import annotations

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trebuchet.spec.dump import dump_yaml

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(value=TEXT, key=TEXT.filter(bool))
@example(value="\x85", key="command")  # was loaded back as ' '
@example(value="a\u2028b\u2029c\rd", key="k")
@example(value="two\nlines", key="k")  # a literal block
def test_any_text_comes_back_as_it_was(value: str, key: str) -> None:
    data = {key: value, "list": [value, {"nested": value}]}
    assert yaml.safe_load(dump_yaml(data)) == data
