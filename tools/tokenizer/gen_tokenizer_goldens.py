#!/usr/bin/env python3
"""Expected token ids from Hugging Face `tokenizers` (the real implementation) for the dsflash tokenizer tests.

Usage: gen_tokenizer_goldens.py V3_TOKENIZER_JSON V41_TOKENIZER_JSON OUT_JSON
Runs where `import tokenizers` works (the Debian-unstable chroot made by make_unstable_chroot.sh; the wrapper
gen_tokenizer_goldens.sh does the copying). The corpus is built here, deterministically, and stored in the output
next to the ids so the C++ test needs nothing else. Texts with ill-formed UTF-8 are stored as hex; Hugging Face
takes str, so their expected ids are those of bytes.decode('utf-8', 'replace') (what dsflash does to such input).
"""
import json
import random
import sys

import tokenizers
from tokenizers import Tokenizer


def corpus():
    cases = []

    def add(name, text):
        cases.append((name, text))

    # English prose and code.
    add("prose", "The quick brown fox jumps over the lazy dog. It's 5 o'clock, isn't it? "
        "Dr. Smith (PhD) paid $1,234.56 for 3.5kg of apples -- a 12% discount!")
    add("prose_caps", "HELLO World hello WORLD HeLLo wOrLd; McDonald's iPhone eBay NASA's U.S.A.")
    add("golden_probe", "Hello, world! 123\nsecond line")
    add("code_python", "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
        "print([fib(i) for i in range(10)])  # 0 1 1 2 3 5 8\n")
    add("code_cpp", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n"
        "\treturn v[0] == 2 ? 0 : 1; // ok\n}\n")
    add("code_json", '{"name": "dsflash", "ids": [0, 1, 2], "nested": {"a": null, "b": true, "c": -1.5e-3}}')
    add("code_html", '<div class="x"><a href="https://example.com/a?b=c&d=e#f">link</a></div>\n<!-- note -->')
    add("code_shell", "for f in *.txt; do echo \"$f\" | sed -e 's/a/b/g' >> out.log 2>&1; done && ls -la ~/")
    add("urls_emails", "Mail me at first.last+tag@sub.example.co.uk or visit http://a.b/c_d-e/~f?g=1&h=%20.")
    # Scripts.
    add("chinese", "深度求索（DeepSeek）是一家人工智能公司。我们今天学习了大语言模型的原理，包括注意力机制和混合专家。")
    add("chinese_mixed", "模型V4.1在2026年发布，参数量为284B，上下文长度1M tokens。“引号”和《书名》以及、顿号。")
    add("japanese", "こんにちは、世界！カタカナとひらがなと漢字を混ぜます。ｶﾀｶﾅ半角もあります。ーヽヾゝゞ")
    add("korean", "안녕하세요, 세계! 한국어 텍스트도 포함됩니다. 숫자 123과 함께.")
    add("arabic", "مرحبا بالعالم! هذه جملة عربية مع أرقام ١٢٣٤٥ و 678 وعلامات ترقيم؟")
    add("hindi", "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। संख्याएँ: १२३ और 456।")
    add("thai_russian_greek", "สวัสดีชาวโลก Привет, мир! Ελληνικά γράμματα: αβγδε ΑΒΓΔΕ.")
    add("hebrew_accents", "שלום עולם. Café naïve façade résumé coöperate Ångström żółć Øresund.")
    add("combining", "e\u0301 a\u0308 n\u0303 Z\u0351\u0333\u0347a\u0336l\u0358g\u0330o\u0354 \u0915\u094d\u0937")
    # Emoji.
    add("emoji", "I ❤️ Python 🐍! 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 1️⃣ #️⃣ 🧑🏾‍🚀 😀😃😄")
    add("emoji_zwj_run", "👩‍💻👨‍🔬👩🏻‍❤️‍💋‍👨🏼🐻‍❄️")
    # Numbers of every length.
    for n in range(1, 41):
        add(f"digits_{n}", "".join(str((i * 7 + 3) % 10) for i in range(n)))
    add("numbers_mixed", "3.14159 -42 +7 1e10 0x1F 1,000,000 2026-11-29 12:34:56 v1.2.3 #12 50% 1/2 ½ ² ³ Ⅻ ⅷ")
    add("numbers_wide", "１２３４５ ٠١٢٣٤٥٦٧٨٩ ०१२३ 一二三 ①②③ 𝟙𝟚𝟛")
    add("numbers_letters", "abc123def4567ghi89012jkl a1b2c3 123abc abc123")
    # Whitespace and newlines.
    for n in (1, 2, 3, 4, 7, 16, 33):
        add(f"spaces_{n}", "a" + " " * n + "b")
        add(f"newlines_{n}", "x" + "\n" * n + "y")
    add("tabs", "\tindent\t\tx\t \t y \t")
    add("crlf", "line1\r\nline2\r\n\r\nline3\rline4\n\r")
    add("trailing_ws", "end with spaces   ")
    add("leading_ws", "   start with spaces")
    add("only_ws", " \n \t \n\n  ")
    add("mixed_ws", "a \n b  \n\n c \t\n d")
    add("unicode_spaces", "a\u00a0b\u3000c\u2028d\u2029e\u0085f\u180eg\u200bh\u2003i\u202fj\ufeffk")
    add("indent_code", "    if x:\n        y = 1\n\n\n    else:\n            z")
    # Punctuation runs.
    add("punct", "!!! ??? ... ,,, ;;; ::: --- ___ === +++ *** ### @@@ $$$ %%% ^^^ &&& ||| ~~~ ``` '''")
    add("punct_mixed", "Wait...what?! (really) [yes] {no} <maybe> \"quoted\" 'single' -- em—dash – en «guill» ¿Qué? ¡Sí!")
    add("punct_letters", "!abc ?Def .ghi ,jkl -mno _pqr :stu /vwx \\yz @foo #bar $baz %qux ^a &b *c +d =e |f ~g `h")
    add("punct_newlines", "end.\n\nnext!\r\n\r\n...\n")
    add("markdown", "# Title\n\n## Sub\n\n- item **bold** _it_ `code`\n1. one\n> quote\n\n| a | b |\n|---|---|\n")
    add("math", "∑_{i=1}^{n} x_i² ≤ ∫₀¹ f(x)dx ≈ π/4 ± ε; ∀x∈ℝ ∃y: x≠y → ¬(x≡y)")
    # Added / special tokens in text.
    add("bos_eos", "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>")
    add("chat_tokens", "<｜User｜>Hello<｜Assistant｜><think>Let me think.</think>Answer.<｜end▁of▁sentence｜>")
    add("system_token", "<｜begin▁of▁sentence｜><｜System｜>You are helpful.<｜User｜>hi<｜Assistant｜></think>")
    add("image_token", "<｜User｜><｜deepseek_image｜>\n\nWhat is in the image?<｜deepseek_image｜><｜deepseek_image｜>")
    add("dsml", "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
        "string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>")
    add("partial_tokens", "<｜User <｜User｜ ｜User｜> <｜Assistant <think <think> </think </think>> <<think>>")
    add("adjacent_tokens", "x<think></think>y <think> </think> z<｜User｜><｜User｜>w")
    add("pad_and_fim", "<｜▁pad▁｜><｜fim▁begin｜>a<｜fim▁hole｜>b<｜fim▁end｜>")
    add("tool_tokens", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    add("task_tokens", "<｜latest_reminder｜>r<｜action｜><｜query｜><｜read_url｜><dsml:x</dsml:")
    add("placeholders", "<｜place▁holder▁no▁799｜><|place_holder_mm_span_0436|><｜place▁holder▁no▁5｜>")
    # Long runs.
    add("long_word", "a" * 300)
    add("long_mixed", ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20).strip())
    add("long_cjk", "我" * 200 + "の" * 50)
    add("long_punct", "=" * 120 + "\n" + "-" * 77)
    add("long_digits", "9" * 250)
    add("base64", "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
    add("empty", "")
    add("single_space", " ")
    add("single_newline", "\n")
    # Random mixtures from a pool covering every branch of the regexes.
    pool = (list("abcXYZ019 \t\n\r!?.,;:'\"-_/\\()[]{}<>@#$%^&*+=|~`") +
            list("éüßøΩж中文字ひらカナ한ع्ह\u0301\u0308\u200d\ufe0f\u00a0\u3000\u2028١２½Ⅻ🙂👍🏽🇫") +
            ["<｜User｜>", "<think>", "</think>", "<｜System｜>", "<｜begin▁of▁sentence｜>", "｜DSML｜", "  ", "\n\n"])
    rng = random.Random(20261129)
    for i in range(400):
        n = rng.randint(1, 40)
        add(f"random_{i}", "".join(rng.choice(pool) for _ in range(n)))
    return cases


def invalid_utf8_cases():
    raw = [
        ("lone_continuation", b"ab\x80cd\xbf"),
        ("truncated_2", b"x\xc3"),
        ("truncated_3", b"x\xe4\xb8 y"),
        ("truncated_4", b"\xf0\x9f\x98"),
        ("overlong", b"\xc0\x80\xc1\xbf\xe0\x80\x80"),
        ("surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
        ("too_high", b"\xf4\x90\x80\x80\xf5\xff\xfe"),
        ("mixed_valid", "中文".encode() + b"\xe4" + "文字 ok".encode() + b"\xf0\x9f" + "🙂".encode()),
        ("invalid_in_token", "<｜User".encode() + b"\xff" + "｜>".encode()),
        ("many_bad", bytes(range(0x80, 0x100))),
    ]
    return raw


def main():
    v3_path, v41_path, out_path = sys.argv[1:4]
    v3 = Tokenizer.from_file(v3_path)
    v41 = Tokenizer.from_file(v41_path)
    cases = []
    for name, text in corpus():
        cases.append({"name": name, "text": text,
                      "v3": v3.encode(text, add_special_tokens=False).ids,
                      "v41": v41.encode(text, add_special_tokens=False).ids})
    for name, raw in invalid_utf8_cases():
        text = raw.decode("utf-8", "replace")
        cases.append({"name": "invalid_" + name, "hex": raw.hex(),
                      "v3": v3.encode(text, add_special_tokens=False).ids,
                      "v41": v41.encode(text, add_special_tokens=False).ids})
    # Decoding: id sequences (some split inside characters, some with added / special tokens).
    decodes = []
    for case in cases[:60]:
        ids = case["v41"]
        decodes.append({"ids": ids, "text": v41.decode(ids, skip_special_tokens=False),
                        "text_skip_special": v41.decode(ids, skip_special_tokens=True)})
    for ids in ([19923, 14, 2058], [1, 0, 2, 128803, 128799, 129264, 128821], [128000, 128805, 129279],
                [6, 7], [223], [155, 155, 155], [300, 128804, 301], list(range(3, 259))):
        decodes.append({"ids": ids, "text": v41.decode(ids, skip_special_tokens=False),
                        "text_skip_special": v41.decode(ids, skip_special_tokens=True)})
    # Added-token flags DeepSeek's files do not use (lstrip, rstrip, single_word, special+normalized): the V3
    # tokenizer plus these records; the C++ test appends the same records. Ids are the ones Hugging Face assigns
    # ("word" is already in the vocab as 3899; new contents get the next free id), which dsflash checks.
    extra = [
        {"id": 128815, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 128816, "content": "[R]", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": True, "special": False},
        {"id": 3899, "content": "word", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 128817, "content": "<both>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": False},
    ]
    with open(v3_path, encoding="utf-8") as f:
        flagged_json = json.load(f)
    flagged_json["added_tokens"].extend(extra)
    flagged = Tokenizer.from_str(json.dumps(flagged_json))
    flag_texts = ["a <mask> b", "a<mask>b", "  <mask>  x", "x [R]   y", "x[R]\n\ny", "word words sword word_ word",
                  "(word) 1word word1 wordé éword", "  <both>  ", "a\t<both>\nb", "<mask><mask> [R][R] word word",
                  "\u00a0<mask>\u3000", "<both>word<both> word"]
    flag_cases = [{"text": t, "ids": flagged.encode(t, add_special_tokens=False).ids} for t in flag_texts]
    out = {"generator": "tools/tokenizer/gen_tokenizer_goldens.py",
           "tokenizers_version": tokenizers.__version__,
           "v3_tokenizer": "deepseek_v3_tokenizer.json",
           "v41_tokenizer": "deepseek_v41_tokenizer.reconstructed.json",
           "cases": cases, "decodes": decodes,
           "flag_tokens": extra, "flag_cases": flag_cases}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
