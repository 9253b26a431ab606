#!/usr/bin/env python3
"""Pre-tokenizer behaviour of Hugging Face tokenizers for EVERY code point (catches Unicode-property
differences between Oniguruma, used by Hugging Face, and PCRE2, used by dsflash).

Usage: gen_codepoint_goldens.py TOKENIZER_JSON OUT_JSON   (run where `import tokenizers` works)
For each scalar value c, the text "x" c "1 " c c "\\n" c "!" is pre-tokenized and its piece lengths (in code
points) form a signature; consecutive code points with equal signatures are stored as [first, last, signature].
"""
import json
import sys

import tokenizers
from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    pre = tok.pre_tokenizer
    runs = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        pieces = pre.pre_tokenize_str("x" + c + "1 " + c + c + "\n" + c + "!")
        sig = ",".join(str(e - b) for _, (b, e) in pieces)
        contiguous = runs and (runs[-1][1] == cp - 1 or (runs[-1][1] == 0xD7FF and cp == 0xE000))
        if contiguous and runs[-1][2] == sig:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, sig])
    with open(sys.argv[2], "w") as f:
        json.dump({"generator": "tools/tokenizer/gen_codepoint_goldens.py",
                   "tokenizers_version": tokenizers.__version__,
                   "template": "x{c}1 {c}{c}\\n{c}!", "runs": runs}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
