"""pipeline/jsontext.py: lone surrogates are refused where JSON text is read, naming where they sit."""

from __future__ import annotations

import pytest

from pipeline.jsontext import LoneSurrogate, loads


@pytest.mark.parametrize(
    ("text", "path", "in_key"),
    [
        (r'{"messages": [{"role": "user", "content": "a\ud800b"}]}', "messages[0].content", False),
        (r'{"a": [1, "ok", {"b\udfff": 2}]}', "a[2]", True),
        (r'"\udc00"', "", False),
        (r'["\ud83d\ude00", "x", "\ud83d"]', "[2]", False),
    ],
)
def test_a_lone_surrogate_is_named_by_its_path(text: str, path: str, in_key: bool) -> None:
    with pytest.raises(LoneSurrogate) as raised:
        loads(text)
    assert raised.value.path == path
    assert ("a key" in str(raised.value)) is in_key


def test_pairs_and_plain_text_pass() -> None:
    assert loads(r'{"k\ud83d\ude00": ["\ud83d\ude00", "é", "plain"]}') == {"k😀": ["😀", "é", "plain"]}
