#!/usr/bin/env python3
"""tessel's HfTokenizer against PyPI's `tokenizers` (./tessel conformance --tokenizers).

Builds tokenizer.json files with `tokenizers` itself (nothing is downloaded):
a BPE trained on the default corpus, saved in the shapes real models ship:

  gpt2            byte-level BPE, ByteLevel pre-tokenizer (GPT-2's regex),
                  <|endoftext|>, a non-special added token, an lstrip/rstrip one
  llama3          byte-level BPE, Split(LLaMA-3's regex) + ByteLevel(use_regex=False),
                  ignore_merges, <|begin_of_text|> template, added specials after the vocabulary
  llama2          SentencePiece-style BPE with byte_fallback / fuse_unk, normalizer
                  Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer,
                  decoder Sequence[Replace, ByteFallback, Fuse, Strip], <s> template
  llama2-first    the same model as transformers' converter writes it today:
                  Metaspace(prepend_scheme "first", split false), no normalizer
  llama2-legacy   the older form: Metaspace(add_prefix_space) pre-tokenizer and decoder

then encodes the corpus (whole, and fortune by fortune), ~1 MB of seeded
random text (scripts, emojis, digits, whitespace runs, CRLF, special tokens)
and hand-picked edge cases with both `tokenizers` and tessel
(bazel-bin/test/conformance/tokenize), and requires the same ids and the same
decode(ids, skip_special_tokens=False), token for token; also the decoding of
every single id and of random id sequences (where `tokenizers` gives valid
text: tessel keeps raw bytes where `tokenizers` writes U+FFFD).
Exit status 0 when everything matches.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
META = "\u2581"


def corpus_files(path):
    """As tessel's corpus_files(): a file, or a folder's regular files except *.dat / *.u8, by name."""
    if os.path.isfile(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if not n.endswith((".dat", ".u8")))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def load_corpus(path):
    return "".join(open(f, "rb").read().decode("utf-8") for f in corpus_files(path))


def train_bpe(lines, vocab_size, pre_tokenizer, special_tokens, model_kwargs, initial_alphabet=(), limit_alphabet=None):
    tok = Tokenizer(models.BPE(**model_kwargs))
    tok.pre_tokenizer = pre_tokenizer
    kwargs = dict(vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=list(initial_alphabet),
                  show_progress=False)
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(lines, trainers.BpeTrainer(**kwargs))
    return tok


def build_tokenizers(corpus, out_dir):
    lines = corpus.splitlines(keepends=True)
    built = {}

    # GPT-2 style.
    tok = train_bpe(lines, 3000, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], {},
                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken("<|fim|>", special=False, normalized=True)])
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True, normalized=False)])
    built["gpt2"] = tok

    # LLaMA-3 style.
    split = pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False)
    tok = train_bpe(lines, 3000,
                    pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                    [], {"ignore_merges": True}, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Whole words in the vocabulary that no merge makes (LLaMA-3's vocabulary has such tokens):
    # only ignore_merges gives them as one token.
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    counts = {}
    for w in split.pre_tokenize_str(corpus[:500_000]):
        counts[w[0]] = counts.get(w[0], 0) + 1
    injected = 0
    for w, _ in sorted(counts.items(), key=lambda kv: -kv[1]):
        spelled = byte_level.pre_tokenize_str(w)[0][0]
        if spelled not in vocab and injected < 300:
            vocab[spelled] = len(vocab)
            injected += 1
    tok = Tokenizer.from_str(json.dumps(d))
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(8)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bot)]),
    ])
    built["llama3"] = tok

    # SentencePiece style (LLaMA-2 / Mixtral): <unk> <s> </s>, the 256 byte tokens, then the merges.
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    base = train_bpe(lines, 3000, pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always", split=True),
                     ["<unk>", "<s>", "</s>"] + byte_tokens,
                     {"unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True}, limit_alphabet=120)
    d = json.loads(base.to_str())
    # LLaMA-2's file lists only <unk>, <s>, </s> as added tokens; the byte tokens are model vocabulary.
    d["added_tokens"] = [t for t in d["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    d["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    sp_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": META}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    d["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": META},
        {"type": "Replace", "pattern": {"String": " "}, "content": META}]}
    d["pre_tokenizer"] = None
    d["decoder"] = sp_decoder
    built["llama2"] = Tokenizer.from_str(json.dumps(d))
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": META, "prepend_scheme": "first", "split": False}
    built["llama2-first"] = Tokenizer.from_str(json.dumps(d))
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": META, "add_prefix_space": True}
    d["decoder"] = {"type": "Metaspace", "replacement": META, "add_prefix_space": True}
    built["llama2-legacy"] = Tokenizer.from_str(json.dumps(d))

    paths = {}
    for name, tok in built.items():
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        paths[name] = os.path.join(out_dir, name, "tokenizer.json")
        tok.save(paths[name])
        # What is compared is the file as `tokenizers` reads it back.
        built[name] = Tokenizer.from_file(paths[name])
    return built, paths


SPECIALS = ["<|endoftext|>", "<|fim|>", "<mask>", "<|begin_of_text|>", "<|end_of_text|>",
            "<|reserved_special_token_3|>", "<s>", "</s>", "<unk>", "<0x41>"]

EDGE_CASES = [
    "", " ", "   ", "\n", "\r\n", "a", " hello", "hello ", "Hello world", "hello  world", "  leading and trailing  ",
    "I'm here, don't you'll WE'LL they'RE 've 'D 'ſt 'S", "'hello", "(parenthesised)", "\ttab\tseparated",
    "12345 1234567 3.14159 1,000,000 2024-06-01 ²³ ٣٤٥", "€100 $5 ¥20", "line1\r\nline2\r\n\r\nline4\n\n\n",
    "a \n\n b", "x\r\r\ry", "spaces      then\ttabs\t\t\tthen\u00a0nbsp\u2003em\u3000ideo",
    "café naïve résumé Ελληνικά русский 日本語 한국어 العربية हिन्दी",
    "emoji 😀 👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "e\u0301 combining", "zero\u200bwidth", "\u0085next line",
    "Hello<|endoftext|>world", "<|endoftext|>", "<|endoftext|><|endoftext|>", "a <mask> b", "a<mask>b",
    "x  <mask>  y", "<|fim|>code<|fim|>", "<|begin_of_text|>Hi<|end_of_text|>", "<s>[INST] hi [/INST]</s>",
    "<s>", "</s> trailing", "<0x41> literal byte token", "<unk>", "<|reserved_special_token_3|> r",
    "<<s>>", "<|endoftext", "ſ ß ǅ ﬁ", "\u2581already metaspace\u2581", "MiXeD CaSe WORDS", "a" * 300,
    " " * 40 + "x", "日本" * 100,
]


def random_text(rng, n_chars):
    words = ["the", "of", "and", "program", "computer", "Fortune", "love", "never", "tomorrow", "WHY", "x", "Qq"]
    other = ["café", "naïve", "Ελληνικά", "русский", "日本語", "한국어", "العربية", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷",
             "e\u0301", "ß", "ſt", "Ω", "№", "™", "…", "—", "«»", "\u00a0", "\u2003", "\u3000", "\u200b"]
    punct = [".", ",", "!", "?", "...", "'s", "'T", "'RE", "'ll", "'", "\"", "(", ")", "[", "]", "-", "--", ":", ";",
             "#", "$", "%", "&", "*", "+", "/", "<", ">", "=", "@", "\\", "^", "_", "`", "{", "|", "}", "~"]
    spaces = [" ", " ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\n ", "\r", "    \n\n  "]
    out, size = [], 0
    while size < n_chars:
        r = rng.random()
        if r < 0.45:
            w = rng.choice(words)
            w = w.upper() if rng.random() < 0.1 else (w.capitalize() if rng.random() < 0.2 else w)
        elif r < 0.55:
            w = str(rng.randrange(10 ** rng.randrange(1, 9)))
        elif r < 0.65:
            w = rng.choice(other)
        elif r < 0.80:
            w = rng.choice(punct)
        elif r < 0.98:
            w = rng.choice(spaces)
        else:
            w = rng.choice(SPECIALS)
        out.append(w)
        size += len(w)
    return "".join(out)


def requests_for(corpus, rng):
    """(label, request) pairs; requests are what tokenize.cc reads."""
    reqs = [("corpus (whole)", {"encode": corpus})]
    for i, fortune in enumerate(corpus.split("\n%\n")):
        reqs.append((f"fortune {i}", {"encode": fortune}))
    synthetic = random_text(rng, 1_000_000)
    pos = 0
    while pos < len(synthetic):
        n = rng.randrange(1, 4000)
        reqs.append((f"random text [{pos}, {pos + n})", {"encode": synthetic[pos:pos + n]}))
        pos += n
    for i, text in enumerate(EDGE_CASES):
        reqs.append((f"edge case {i}", {"encode": text}))
        reqs.append((f"edge case {i}, add_special_tokens=False", {"encode": text, "add_special_tokens": False}))
        reqs.append((f"edge case {i}, encode_special_tokens", {"encode": text, "match_special_tokens": False}))
    return reqs


PRE_TOKENIZERS = {
    "gpt2": pre_tokenizers.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
                                 behavior="isolated", invert=False),
    "llama3": pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
}


def python_answers(tok, reqs):
    answers = []
    for _, req in reqs:
        if "pretokenize" in req:
            answers.append({"pieces": [p for p, _ in PRE_TOKENIZERS[req["regex"]].pre_tokenize_str(req["pretokenize"])]})
        elif "encode" in req:
            tok.encode_special_tokens = not req.get("match_special_tokens", True)
            ids = tok.encode(req["encode"], add_special_tokens=req.get("add_special_tokens", True)).ids
            tok.encode_special_tokens = False
            answers.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        else:
            answers.append({"decoded": tok.decode(req["decode"], skip_special_tokens=False)})
    return answers


def show(ids, tok, at):
    lo, hi = max(0, at - 3), at + 4
    return " ".join(f"{i}:{tok.id_to_token(i)!r}" for i in ids[lo:hi])


def check(name, tok, path, exe, corpus, out_dir, verbose):
    rng = random.Random(1234)
    reqs = requests_for(corpus, rng)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    decode_reqs = [(f"decode [{i}]", {"decode": [i]}) for i in range(vocab)]
    for k in range(300):
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 24))]
        decode_reqs.append((f"decode random sequence {k}", {"decode": seq}))
    all_reqs = reqs + decode_reqs
    if name in ("gpt2", "llama3"):
        # The hand-written pre-tokenizer regex on every text, piece for piece.
        all_reqs += [(f"{label}: pretokenize", {"pretokenize": r["encode"], "regex": name}) for label, r in reqs]
    req_path = os.path.join(out_dir, name, "requests.jsonl")
    ans_path = os.path.join(out_dir, name, "answers.jsonl")
    with open(req_path, "w", encoding="utf-8") as f:
        for _, r in all_reqs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    t0 = time.time()
    want = python_answers(tok, all_reqs)
    t1 = time.time()
    subprocess.run([exe, "--tokenizer", path, "--in", req_path, "--out", ans_path], check=True)
    t2 = time.time()
    with open(ans_path, encoding="utf-8") as f:
        got = [json.loads(line) for line in f]
    if len(got) != len(all_reqs):
        print(f"  {name}: tessel answered {len(got)} of {len(all_reqs)} requests")
        return False

    failures, texts, tokens, nbytes, decodes, skipped, pieces = [], 0, 0, 0, 0, 0, 0
    for (label, req), w, g in zip(all_reqs, want, got):
        if "error" in g:
            failures.append(f"{label}: tessel: {g['error']}")
            continue
        if "pretokenize" in req:
            pieces += len(w["pieces"])
            if g["pieces"] != w["pieces"]:
                at = next((i for i, (a, b) in enumerate(zip(g["pieces"], w["pieces"])) if a != b),
                          min(len(g["pieces"]), len(w["pieces"])))
                failures.append(f"{label}: pieces differ at {at}\n      tessel:     {g['pieces'][at:at + 4]!r}\n"
                                f"      tokenizers: {w['pieces'][at:at + 4]!r}")
            continue
        if "encode" in req:
            texts += 1
            nbytes += len(req["encode"].encode("utf-8"))
            tokens += len(w["ids"])
            if g["ids"] != w["ids"]:
                at = next((i for i, (a, b) in enumerate(zip(g["ids"], w["ids"])) if a != b),
                          min(len(g["ids"]), len(w["ids"])))
                failures.append(f"{label}: ids differ at {at} (tessel {len(g['ids'])}, tokenizers {len(w['ids'])} "
                                f"ids)\n      tessel:     {show(g['ids'], tok, at)}\n      tokenizers: "
                                f"{show(w['ids'], tok, at)}")
                continue
        elif "\ufffd" in w["decoded"]:
            skipped += 1  # `tokenizers` replaced invalid UTF-8; tessel keeps the bytes
            continue
        decodes += 1
        if g["decoded"] != w["decoded"]:
            failures.append(f"{label}: decode differs\n      tessel:     {g['decoded'][:200]!r}\n      tokenizers: "
                            f"{w['decoded'][:200]!r}")
    status = "ok" if not failures else f"{len(failures)} FAILED"
    print(f"  {name}: {status}: {texts} texts ({nbytes / 1e6:.2f} MB, {tokens} tokens) encoded; "
          f"{decodes} decodes ({skipped} with U+FFFD in tokenizers' output not compared); "
          + (f"{pieces} {name} regex pieces; " if pieces else "")
          + f"vocab {vocab}; tokenizers {t1 - t0:.1f} s, tessel {t2 - t1:.1f} s")
    for f in failures[: (len(failures) if verbose else 10)]:
        print("    " + f)
    return not failures, texts, tokens, decodes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="bazel-bin/test/conformance/tokenize")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated names (default: all)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    print(f"tokenizers {tokenizers.__version__}; corpus {args.corpus}")
    corpus = load_corpus(args.corpus)
    built, paths = build_tokenizers(corpus, args.out)
    ok, totals = True, [0, 0, 0]
    for name, tok in built.items():
        if args.only and name not in args.only.split(","):
            continue
        res = check(name, tok, paths[name], args.exe, corpus, args.out, args.verbose)
        ok = ok and res[0]
        if res[0]:
            for k in range(3):
                totals[k] += res[k + 1]
    n = len(built) if not args.only else len(args.only.split(","))
    if ok:
        print(f"tessel conformance --tokenizers: {n} of {n} tokenizer.json files match tokenizers "
              f"{tokenizers.__version__} token for token: {totals[0]} texts, {totals[1]} tokens, "
              f"{totals[2]} decodes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
