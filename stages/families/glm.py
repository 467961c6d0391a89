"""GLM-4.5 / 4.6 / 4.7 / 5.x: `<tool_call>name\\n<arg_key>key</arg_key>\\n<arg_value>value</arg_value>\\n…</tool_call>`,
each value text read as its schema's type (`xml_params.py`); a key the schema does not declare is read as JSON
where it parses, as GLM's own parser does."""

from __future__ import annotations

from stages.families.xml_params import XmlMarkup, xml_family

START, END = "<tool_call>", "</tool_call>"
MARKUP = XmlMarkup(
    name_open="",
    name_end="\n",
    key_open="<arg_key>",
    key_end="</arg_key>",
    value_open="<arg_value>",
    value_end="</arg_value>",
    call_end="",
    key_gap="\n",
    # GLM writes a value exactly as it is (4.7 and 5.x keep its spaces).
    trim="none",
    undeclared_text=False,
)


FAMILY = xml_family(
    "glm",
    MARKUP,
    start=START,
    end=END,
    example=f"{START}<function-name>\n<arg_key><key></arg_key>\n<arg_value><value></arg_value>\n{END}",
)
