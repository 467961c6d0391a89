"""Qwen3-Coder: `<tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n…`
`</function>\\n</tool_call>`, each value text read as its schema's type (`xml_params.py`)."""

from __future__ import annotations

from stages.families.xml_params import XmlMarkup, xml_family

START, END = "<tool_call>", "</tool_call>"
MARKUP = XmlMarkup(
    name_open="<function=",
    name_end=">",
    key_open="<parameter=",
    key_end=">",
    value_open="",
    value_end="</parameter>",
    call_end="</function>",
    start_gap="\n",
    name_gap="\n",
    call_gap="\n",
    pad="\n",
    trim="newline",
)


FAMILY = xml_family(
    "qwen3_coder",
    MARKUP,
    start=START,
    end=END,
    # Qwen3-Coder may leave out `<tool_call>` and start at `<function=`; Qwen3.5+ may open a call inside the
    # think block its prompt opened, without `</think>`.
    bare_calls=True,
    reasoning_openers=(START,),
    example=f"{START}\n<function=<function-name>>\n<parameter=<key>>\n<value>\n</parameter>\n</function>\n{END}",
)
