#!/usr/bin/env python3
"""Golden V4.1 prompts for dsflash's chat encoder, rendered by the public reference encoder.

Usage: gen_chat_goldens.py ENCODING_DSV41_PY CONVERSATIONS_JSON OUT_JSON

ENCODING_DSV41_PY is SGLang's port of the official encoding.py
(sgl-project/sglang python/sglang/srt/entrypoints/openai/encoding_dsv41.py); it is not part of dsflash, fetch it
yourself. It carries the pre-release effort aliases (low 25, high 50, xhigh 75, max 100); the release encoder
uses low 50, high 75, max 100 (MODEL.md §8), so those are patched in before rendering.
Request-level tools go to the first system message, or to an empty system message inserted first (as dsflash
does). Each conversation is rendered in thinking mode at efforts (default, 1, 33, "low", "max") and in chat mode.
Model outputs listed under "completions" are parsed with the reference parse_message_from_completion_text.
"""
import copy
import importlib.util
import json
import sys


def load_reference(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv41", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.REASONING_EFFORT_MAPPINGS = {"low": 50, "high": 75, "max": 100}
    module.DEFAULT_REASONING_EFFORT = "high"
    return module


def attach_tools(messages, tools):
    messages = copy.deepcopy(messages)
    if tools:
        if messages and messages[0].get("role") == "system":
            if not messages[0].get("tools"):
                messages[0]["tools"] = tools
        else:
            messages.insert(0, {"role": "system", "content": "", "tools": tools})
    return messages


def main():
    ref_path, conversations_path, out_path = sys.argv[1:4]
    ref = load_reference(ref_path)
    with open(conversations_path, encoding="utf-8") as f:
        data = json.load(f)
    renders = []
    for conv in data["conversations"]:
        messages = attach_tools(conv["messages"], conv.get("tools"))
        variants = [("thinking", None), ("thinking", 1), ("thinking", 33), ("thinking", "low"),
                    ("thinking", "max"), ("chat", None)]
        for mode, effort in variants:
            entry = {"name": conv["name"], "thinking": mode == "thinking", "effort": effort}
            try:
                prompt, mm = ref.encode_messages(messages, thinking_mode=mode, reasoning_effort=effort,
                                                 return_multi_modal_data=True)
                entry["prompt"] = prompt
                entry["images"] = mm["images"]
            except Exception as e:  # the reference refuses: dsflash must refuse too
                entry["error"] = f"{type(e).__name__}: {e}"
            renders.append(entry)
    parses = []
    for comp in data.get("completions", []):
        entry = {"name": comp["name"], "thinking": comp["thinking"], "text": comp["text"]}
        try:
            entry["parsed"] = ref.parse_message_from_completion_text(comp["text"], "thinking" if comp["thinking"] else "chat")
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        parses.append(entry)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/tokenizer/gen_chat_goldens.py",
                   "reference": "sglang encoding_dsv41.py @ 0e43c224 with release effort aliases",
                   "renders": renders, "parses": parses}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
