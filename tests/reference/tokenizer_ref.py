"""Reference test of mtrain's byte-level BPE against Hugging Face `tokenizers`.

Trains a small byte-level BPE with a Llama-3-style Split pre-tokenizer on a
seeded multilingual sample (so a real tokenizer.json exists with no
download), then checks, token for token on held-out text:
  - mtrain (hf:tokenizer.json) == tokenizers' encoder, specials matched;
  - the same with the merges rewritten in the newer ["a", "b"] pair form;
  - a tiktoken rank file made from the same vocabulary == a direct Python
    implementation of tiktoken's merge rule, with Llama 3.1's 256 special
    names (the default) and Llama 3.0's (--tiktoken-specials llama3.0), both
    taken from transformers' DEFAULT_LLAMA_SPECIAL_TOKENS;
  - \s is Unicode White_Space as in the reference engines: U+180E is not
    whitespace (PCRE2 alone would class it as \s);
  - decode(encode(x)) == x, and `mtrain data build` gives the same tokens.
Prints PASS/FAIL lines. Usage: tokenizer_ref.py BPE_TOOL MTRAIN WORKDIR"""
import json, os, random, struct, subprocess, sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

TOOL, MTRAIN, WORK = sys.argv[1:4]
os.makedirs(WORK, exist_ok=True)
import tok_common
from tok_common import LLAMA3, SPECIALS, result, write_rank_file


WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "don't", "I'll", "we've",
    "She's", "THEY'RE", "café", "naïve", "résumé", "Größe", "straße", "über", "niño", "mañana", "façade",
    "Ελληνικά", "γλώσσα", "Москва", "привет", "мир", "日本語", "東京", "こんにちは", "カタカナ", "中文", "北京",
    "你好世界", "한국어", "안녕하세요", "العربية", "مرحبا", "हिन्दी", "नमस्ते", "ภาษาไทย", "😀", "🚀", "👍🏽",
    "👨‍👩‍👧", "🇫🇷", "12345", "3.14159", "2024-01-01", "$100", "1,000,000", "foo_bar", "x+=1;", "def", "f(x):",
    "return", "{", "}", "<div>", "</div>", "http://example.com", "#include", "==", "!=", "...", "—", "«", "»",
]
SPACES = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "    ", "\u00a0", "\u3000"]


def sample(rng, n_words, specials):
    out = []
    for _ in range(n_words):
        r = rng.random()
        if specials and r < 0.02:
            out.append(rng.choice(SPECIALS))
        elif r < 0.05:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 9))))
        else:
            out.append(rng.choice(WORDS))
        out.append(rng.choice(SPACES))
    return "".join(out)


rng = random.Random(1)
train_texts = [sample(rng, rng.randrange(5, 200), False) for _ in range(3000)]
held = random.Random(2)
held_texts = [sample(held, held.randrange(1, 300), True) for _ in range(300)]
held_texts += [
    "", " ", "   leading and trailing   ", "\n\n\n", "a" * 5000, " " * 3000 + "x", "1234567890" * 50,
    "unseen: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∮ E⋅da = Q, ⠁⠃⠉ ᚠᛇᚻ Ꙭ 龘 𠜎𠜱 \u200b\ufeff",
    "<|end_of_text|><|end_of_text|>x<|begin_of_text|> <|eot_id|>\n",
    "partial <|end_of_tex and <|eot_id| not special", "It's 'S 'LL 'd 'x",
    # U+180E is not White_Space (PCRE2's \s says it is); the others are
    "a \u180eb", "a\u180e b", "\u180e\u180e x", "x \u180e\n", "  \u180e  y\u180e", "word\u180eword !\u180e?",
    "a\u0085b \u2028c\u2029 d\u1680e\u205f f\u202fg\u000bh\u000ci \u200bj\u3000k",
    "tail spaces\u180e   ", "\u00a0\u180e\u00a0x",
    # Llama 3.1 names (python_tag, eom_id, ...) and ones only 3.0 has
    "<|python_tag|>x = 1<|eom_id|><|finetune_right_pad_id|> <|reserved_special_token_2|>",
    "<|reserved_special_token_247|><|reserved_special_token_250|> <|step_id|> <|reserved_special_token_5|>",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=SPECIALS, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(train_texts, trainer)
tj = os.path.join(WORK, "tokenizer.json")
tok.save(tj)
doc = json.load(open(tj))
nmerges = len(doc["model"]["merges"])
result("tokenizer_ref_trained", len(doc["model"]["vocab"]) > 1000 and nmerges > 500,
       "vocab %d merges %d" % (len(doc["model"]["vocab"]), nmerges))

held_path = os.path.join(WORK, "held.jsonl")
with open(held_path, "w") as f:
    for t in held_texts:
        f.write(json.dumps({"text": t}) + "\n")
expected = [tok.encode(t, add_special_tokens=False).ids for t in held_texts]


def mtrain_encode(spec, mode="match", *extra):
    p = subprocess.run([TOOL, "encode", spec, held_path, mode, *extra], capture_output=True, text=True)
    if p.returncode:
        return None, p.stderr.strip()[:300]
    return [[int(x) for x in line.split()] for line in p.stdout.split("\n")[:-1]], ""


def compare(name, got, err, want):
    if got is None:
        return result(name, False, err)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    why = ""
    if bad:
        i = bad[0]
        why = "%d of %d texts differ; first %d: %r\n  got  %s\n  want %s" % (
            len(bad), len(want), i, held_texts[i][:80], got[i][:40], want[i][:40])
    result(name, len(got) == len(want) and not bad, why or "count %d vs %d" % (len(got), len(want)))


got, err = mtrain_encode("hf:" + tj)
compare("tokenizer_hf_matches_reference", got, err, expected)
ntok = sum(len(e) for e in expected)
print("  (%d held-out texts, %d tokens, %d bytes)" % (len(held_texts), ntok, sum(len(t.encode()) for t in held_texts)))

# the newer pair form of merges, and ignore_merges (tiktoken-like lookup first)
doc2 = json.loads(json.dumps(doc))
doc2["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in doc["model"]["merges"]]
tj2 = os.path.join(WORK, "tokenizer_pairs.json")
json.dump(doc2, open(tj2, "w"), ensure_ascii=False)
got, err = mtrain_encode("hf:" + tj2)
compare("tokenizer_hf_pair_merges", got, err, expected)
doc3 = json.loads(json.dumps(doc))  # string merges: older tokenizers read only those
doc3["model"]["ignore_merges"] = True
tj3 = os.path.join(WORK, "tokenizer_ignore.json")
json.dump(doc3, open(tj3, "w"), ensure_ascii=False)
got, err = mtrain_encode("hf:" + tj3)
compare("tokenizer_hf_ignore_merges", got, err,
        [Tokenizer.from_file(tj3).encode(t, add_special_tokens=False).ids for t in held_texts])

# specials as plain text when not matched
got, err = mtrain_encode("hf:" + tj, "text")
k = held_texts.index("<|end_of_text|><|end_of_text|>x<|begin_of_text|> <|eot_id|>\n")
specials_as_text = got is not None and got[k] != expected[k] and all(x not in (0, 1, 2) for x in got[k])
result("tokenizer_specials_as_text", specials_as_text, err or "specials were matched in text mode")

# tiktoken: ranks = the trained vocabulary's ids (bytes recovered from the byte alphabet)
tk_path = os.path.join(WORK, "ranks.tiktoken")
ranks = write_rank_file(doc, tk_path)


def tiktoken_piece(piece):
    """tiktoken's rule, directly: whole piece first, else merge the adjacent
    pair whose concatenation has the lowest rank (leftmost on ties)."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return [ranks[p] for p in parts]


# the pieces come from tokenizers' own pre-tokenizer (the same regex)
pre = pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False)
# Llama 3.0 and 3.1's 256 special names, numbered right after the ranks
from transformers.models.llama.convert_llama_weights_to_hf import DEFAULT_LLAMA_SPECIAL_TOKENS as LLAMA_SPECIALS
result("tokenizer_llama_specials_reference", all(len(LLAMA_SPECIALS[v]) == 256 for v in ("3", "3.1")),
       "transformers' lists are not 256 long")


def tiktoken_encode(text, version="3.1"):
    sp_id = {s: len(ranks) + i for i, s in enumerate(LLAMA_SPECIALS[version])}
    out, i = [], 0
    import re
    pat = re.compile("|".join(re.escape(s) for s in sorted(sp_id, key=len, reverse=True)))
    for seg in re.split("(%s)" % pat.pattern, text):
        if seg in sp_id:
            out.append(sp_id[seg])
            continue
        for piece, _ in pre.pre_tokenize_str(seg):
            out += tiktoken_piece(piece.encode())
    return out


tk_want = [tiktoken_encode(t) for t in held_texts]
got, err = mtrain_encode("tiktoken:" + tk_path)
compare("tokenizer_tiktoken_matches_reference", got, err, tk_want)
got, err = mtrain_encode("tiktoken:" + tk_path, "match", "--tiktoken-specials=llama3.0")
compare("tokenizer_tiktoken_llama30_specials", got, err, [tiktoken_encode(t, "3") for t in held_texts])
# the new cases really exercise both: U+180E pieces and names that differ
# with U+180E as whitespace, "a \u180eb" would split as "a", " ", "\u180eb"
pieces = [p for p, _ in pre.pre_tokenize_str("a \u180eb")]
result("tokenizer_u180e_not_whitespace", pieces == ["a", " \u180e", "b"],
       "the reference pre-tokenizer does not treat U+180E as White_Space says: %r" % pieces)
v30 = [tiktoken_encode(t, "3") for t in held_texts]
result("tokenizer_llama31_names_differ", sum(a != b for a, b in zip(tk_want, v30)) >= 2,
       "3.0 and 3.1 specials encode the held-out texts the same")

for spec in ("hf:" + tj, "tiktoken:" + tk_path):
    p = subprocess.run([TOOL, "roundtrip", spec, held_path], capture_output=True, text=True)
    result("tokenizer_roundtrip_" + spec.split(":")[0], p.returncode == 0, (p.stdout + p.stderr).strip()[:300])

# end to end: mtrain data build with the HF tokenizer and 3 workers
ds = os.path.join(WORK, "ds")
p = subprocess.run([MTRAIN, "data", "build", "--tokenizer", "hf:" + tj, "--special-tokens", "match", "--workers", "3",
                    "--out", ds, held_path], capture_output=True, text=True)
if p.returncode:
    result("tokenizer_data_build_matches_reference", False, p.stderr.strip()[:300])
else:
    raw = b"".join(subprocess.run(["zstd", "-q", "-dc", os.path.join(ds, f)], capture_output=True).stdout
                   for f in sorted(os.listdir(ds)) if f.endswith(".zst"))
    stream = list(struct.unpack("<%dH" % (len(raw) // 2), raw))
    flat = [t for e in expected for t in e]
    result("tokenizer_data_build_matches_reference", stream == flat,
           "stream of %d tokens vs %d expected" % (len(stream), len(flat)))
    # inspect decodes the first document back to its text
    k = len(expected[0])
    p = subprocess.run([MTRAIN, "data", "inspect", ds, "--tokens", str(k), "--tokenizer", "hf:" + tj],
                       capture_output=True, text=True)
    esc = "".join("\\n" if c == "\n" else "\\" + c if c in '"\\' else "\\x%02x" % ord(c) if ord(c) < 32 else c
                  for c in held_texts[0])
    result("tokenizer_inspect_decodes", p.returncode == 0 and ('decoded:    "%s"' % esc) in p.stdout,
           (p.stdout + p.stderr)[-300:])

# one document of ~2.3 MB (a plain text file: one document; more than two of
# data build's 1 MiB pieces) streams through the tokenizer in pieces cut at
# pre-tokenizer boundaries: the same tokens as encoding it whole (the
# reference's one-call encode is what makes this test slow: keep it small)
parts, size, i = [], 0, 0
while size < 2300000:
    parts.append(held_texts[i % len(held_texts)] + ("\n" if i % 7 else "  \n\n "))
    size += len(parts[-1].encode())
    i += 1
long_text = "".join(parts)
long_path = os.path.join(WORK, "long.txt")
with open(long_path, "w") as f:
    f.write(long_text)
ds = os.path.join(WORK, "ds_long")
p = subprocess.run([MTRAIN, "data", "build", "--tokenizer", "hf:" + tj, "--special-tokens", "match", "--workers", "3",
                    "--out", ds, long_path], capture_output=True, text=True)
if p.returncode:
    result("tokenizer_long_document_streams", False, p.stderr.strip()[:300])
else:
    raw = b"".join(subprocess.run(["zstd", "-q", "-dc", os.path.join(ds, f)], capture_output=True).stdout
                   for f in sorted(os.listdir(ds)) if f.endswith(".zst"))
    stream = list(struct.unpack("<%dH" % (len(raw) // 2), raw))
    want = tok.encode(long_text, add_special_tokens=False).ids
    first_bad = next((i for i, (a, b) in enumerate(zip(stream, want)) if a != b), None)
    result("tokenizer_long_document_streams", stream[:len(want)] == want and len(stream) - len(want) <= 1,
           "%d bytes: %d tokens vs %d whole, first difference at %s" % (len(long_text.encode()), len(stream), len(want),
                                                                      first_bad))
sys.exit(1 if tok_common.failed else 0)
