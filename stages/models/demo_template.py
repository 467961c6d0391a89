"""The demo model's chat template: ChatML with Qwen-style tools and thinking.

`CHAT_TEMPLATE` is a Jinja string that transformers renders (it is written
to the model directory as `chat_template.jinja`). Contract:

- Each message is `<|im_start|>{role}\\n{content}<|im_end|>\\n`; `developer`
  renders as `system`. Content is a string or a list of
  `{"type": "text", "text": ...}` parts, whose texts are concatenated (as
  mlx-lm's server joins them).
- `tools` (Qwen2.5 / Hermes style) open the conversation with a system turn
  that holds the leading system message, the JSON signatures inside
  `<tools></tools>`, and the instruction to answer with
  `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
- Assistant `tool_calls` render as such `<tool_call>` JSON blocks;
  `arguments` may be a JSON string or an object. Consecutive `tool`
  messages render as `<tool_response>` blocks inside one user turn.
- `add_generation_prompt` appends `<|im_start|>assistant\\n`; with
  `enable_thinking=false` (Qwen3 style) also an empty `<think>\\n\\n</think>\\n\\n`,
  and with `thinking=true` (DeepSeek V3.1 style) an open `<think>\\n`: the
  answer then starts inside the reasoning.

mlx-lm infers its `json_tools` parser from the `<tool_call>` and
`tool_call.name` text below; keep both.
"""

from __future__ import annotations

CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is sequence and content is not mapping -%}
        {%- for part in content -%}
            {%- if part.type == "text" -%}{{- part.text -}}{%- endif -%}
        {%- endfor -%}
    {%- elif content is defined and content is not none -%}
        {{- content -}}
    {%- endif -%}
{%- endmacro -%}
{%- set leads_with_system = messages and messages[0].role in ["system", "developer"] -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if leads_with_system %}
        {{- render_content(messages[0].content) + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif leads_with_system %}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role in ["system", "developer"] %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\\n' + render_content(message.content) }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unsupported message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- elif thinking is defined and thinking %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""
