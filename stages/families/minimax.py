"""MiniMax-M2: `<minimax:tool_call>\\n<invoke name="name">\\n<parameter name="key">value</parameter>\\n…</invoke>\\n
</minimax:tool_call>`, every call of a turn an `<invoke>` of one section, each value text read as its schema's type
(`xml_params.py`)."""

from __future__ import annotations

from stages.families.xml_params import XmlMarkup, xml_family

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
MARKUP = XmlMarkup(
    name_open='<invoke name="',
    name_end='">',
    key_open='<parameter name="',
    key_end='">',
    value_open="",
    value_end="</parameter>",
    call_end="</invoke>",
    start_gap="\n",
    name_gap="\n",
    call_gap="\n",
)


FAMILY = xml_family(
    "minimax",
    MARKUP,
    start=START,
    end=END,
    example=f'{START}\n<invoke name="<function-name>">\n<parameter name="<key>"><value></parameter>\n</invoke>\n{END}',
)
