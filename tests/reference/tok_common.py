"""Shared pieces of the tokenizer reference tests (tokenizer_ref.py,
hf_tokenizer_export.py): Llama 3's pre-tokenizer regex, the specials the
test tokenizers are trained with, PASS/FAIL reporting, and the tiktoken rank
file made from a trained byte-level tokenizer.json."""
import base64

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
failed = 0


def result(name, ok, why=""):
    """One PASS/FAIL line (counted by tests/run.sh); failures are counted in `failed`."""
    global failed
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)
    failed += not ok


def write_rank_file(doc, path):
    """A tiktoken rank file from a trained tokenizer.json `doc`: each ordinary
    token's bytes (GPT-2's byte alphabet undone) ranked by its id; the trained
    specials take ids 0..len(SPECIALS)-1, so the ranks shift down by that.
    Returns {bytes: rank}."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char_to_byte = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {bytes(char_to_byte[c] for c in k): v - len(SPECIALS) for k, v in doc["model"]["vocab"].items()
             if k not in SPECIALS}
    with open(path, "w") as f:
        for b, r in sorted(ranks.items(), key=lambda x: x[1]):
            f.write("%s %d\n" % (base64.b64encode(b).decode(), r))
    return ranks
