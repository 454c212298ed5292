"""The tokenizer travels from `mtrain data build` to a Hugging Face export.

For a tiktoken rank file and an HF tokenizer.json (both made here: a small
byte-level BPE trained with `tokenizers` on a seeded sample, the rank file
derived from its vocabulary), this builds a dataset with --append-eod,
trains a tiny model with `model.vocab_size: auto`, exports it with
`mtrain convert --hf` and checks with transformers, no edits:
  - AutoTokenizer.from_pretrained(dir) encodes every sample text to exactly
    the tokens mtrain wrote into the dataset (read back with `zstd -dc`):
    the tiktoken dataset is built with --special-tokens match (HF's own
    default); the HF one with the default --special-tokens text, where a
    special token's text in a document stays text, so the one sample with
    such text needs AutoTokenizer(..., split_special_tokens=True) and every
    other sample matches the plain AutoTokenizer;
  - AutoModelForCausalLM.from_pretrained(dir).generate() runs, and
    config.json's bos/eos ids are the tokenizer's <|begin_of_text|> and the
    dataset's EOD;
  - the model's vocabulary is exactly the tokenizer's (auto).
Then the soft failures: a dataset that is gone (model written, a warning, no
tokenizer files) and `--tokenizer SPEC` as the override.
Prints PASS/FAIL lines. Usage: hf_tokenizer_export.py MTRAIN WORKDIR"""
import json, os, random, shutil, struct, subprocess, sys, warnings

warnings.filterwarnings("ignore")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

MTRAIN, WORK = sys.argv[1:3]
os.makedirs(WORK, exist_ok=True)
os.chdir(WORK)
import tok_common
from tok_common import LLAMA3, SPECIALS, result, write_rank_file


def run(*args):
    p = subprocess.run([MTRAIN, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "don't", "I'll",
         "café", "naïve", "Größe", "Москва", "привет", "日本語", "東京", "中文", "你好", "한국어", "😀", "🚀",
         "12345", "3.14", "$100", "foo_bar", "x+=1;", "f(x):", "{", "}", "<div>", "—", "«", "»"]
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\n\n", " \n", "\u00a0", "\u180e", "\u3000"]


def sample(rng, n):
    return "".join(rng.choice(WORDS) + rng.choice(SPACES) for _ in range(n))


rng = random.Random(5)
train_texts = [sample(rng, rng.randrange(5, 80)) for _ in range(1500)]
texts = [sample(rng, rng.randrange(1, 60)) for _ in range(60)] + [
    "It's 'S 'LL 'd", "a \u180eb and \u180e\u180e x", "  leading and trailing  ", "1234567890" * 5,
    "special text <|end_of_text|> stays text", "unseen 𝔘𝔫𝔦 ⠁⠃ 龘 \u200b"]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(train_texts, trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save("tokenizer.json")
doc = json.load(open("tokenizer.json"))

# the rank file: the trained vocabulary's bytes (GPT-2 alphabet undone), specials dropped
ranks = write_rank_file(doc, "ranks.tiktoken")
with open("texts.jsonl", "w") as f:
    for t in texts:
        f.write(json.dumps({"text": t}) + "\n")

RECIPE = """model:
  vocab_size: auto
  hidden_size: 32
  num_layers: 2
  num_heads: 4
  num_kv_heads: 2
  intermediate_size: 64
train:
  seq_len: 32
  micro_batch: 2
  global_batch: 2
  steps: 2
  device: cpu
data:
  path: %s
checkpoint:
  dir: %s
  interval: 2
log:
  dir: %s
"""


def dataset_stream(ds, width):
    raw = b"".join(subprocess.run(["zstd", "-q", "-dc", os.path.join(ds, f)], capture_output=True).stdout
                   for f in sorted(os.listdir(ds)) if f.endswith(".zst"))
    return list(struct.unpack("<%d%s" % (len(raw) // width, "H" if width == 2 else "I"), raw))


def check(name, spec, match):
    ds, ck, out = "ds_" + name, "ck_" + name, "hf_" + name
    rc, log = run("data", "build", "--tokenizer", spec, "--append-eod", "--quiet", "--special-tokens",
                  "match" if match else "text", "--out", ds, "texts.jsonl")
    if rc:
        return result("hf_tokenizer_%s_build" % name, False, log[-300:])
    rc, log = run("data", "inspect", ds, "--tokens", "4")
    result("hf_tokenizer_%s_inspect_record" % name, rc == 0 and ("tokenizer:  " + spec) in log and "xxh3 " in log,
           log[:400])
    open("r_%s.yaml" % name, "w").write(RECIPE % (ds, ck, "run_" + name))
    rc, log = run("pretrain", "r_%s.yaml" % name)
    if rc:
        return result("hf_tokenizer_%s_pretrain" % name, False, log[-400:])
    shutil.rmtree(out, ignore_errors=True)
    rc, log = run("convert", ck, "--hf", out)
    if rc or not os.path.exists(os.path.join(out, "tokenizer.json")):
        return result("hf_tokenizer_%s_convert" % name, False, log[-400:])

    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf = AutoTokenizer.from_pretrained(out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    eod = hf.convert_tokens_to_ids("<|end_of_text|>")
    bos = hf.convert_tokens_to_ids("<|begin_of_text|>")
    result("hf_tokenizer_%s_vocab_auto" % name, cfg["vocab_size"] == len(hf),
           "config vocab %d, tokenizer %d" % (cfg["vocab_size"], len(hf)))
    result("hf_tokenizer_%s_bos_eos_ids" % name, cfg.get("bos_token_id") == bos and cfg.get("eos_token_id") == eod and
           hf.eos_token_id == eod and hf.bos_token_id == bos,
           "config bos %s eos %s, tokenizer bos %s eos %s, expected %d %d" % (
               cfg.get("bos_token_id"), cfg.get("eos_token_id"), hf.bos_token_id, hf.eos_token_id, bos, eod))
    # AutoTokenizer's encode (no edits to the files) against the dataset's tokens
    as_text = AutoTokenizer.from_pretrained(out, split_special_tokens=True)
    want, plain_ok = [], True
    for t in texts:
        ids = hf(t)["input_ids"]
        if not match and any(s in t for s in SPECIALS):
            plain_ok &= ids != as_text(t)["input_ids"]  # the case that needs it really differs
            ids = as_text(t)["input_ids"]
        want += ids + [eod] if t else []
    got = dataset_stream(ds, 2 if cfg["vocab_size"] <= 65536 else 4)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    result("hf_tokenizer_%s_autotokenizer_matches" % name, got == want and plain_ok,
           "%d tokens vs %d, first difference at %s (special text differs: %s)" % (len(got), len(want), first,
                                                                                  plain_ok))
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = hf("Hello world", return_tensors="pt")
    gen = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=eod)
    result("hf_tokenizer_%s_generate" % name, gen.shape[1] > ids["input_ids"].shape[1] and
           isinstance(hf.decode(gen[0]), str), "generated %s" % gen)
    return ck


check("hf", "hf:tokenizer.json", False)
ck = check("tiktoken", "tiktoken:ranks.tiktoken", True)

# the rank file's specials are Llama 3.1's, numbered after the ranks
if ck:
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained("hf_tiktoken")
    base = len(ranks)
    result("hf_tokenizer_tiktoken_llama31_specials",
           hf.convert_tokens_to_ids("<|python_tag|>") == base + 10 and
           hf.convert_tokens_to_ids("<|eom_id|>") == base + 8 and
           hf.convert_tokens_to_ids("<|reserved_special_token_247|>") == base + 255,
           "python_tag %s" % hf.convert_tokens_to_ids("<|python_tag|>"))
    # the dataset gone: the model is written, a warning, no tokenizer files
    os.rename("ds_tiktoken", "ds_moved")
    shutil.rmtree("hf_gone", ignore_errors=True)
    rc, log = run("convert", ck, "--hf", "hf_gone")
    result("hf_tokenizer_dataset_gone_warns", rc == 0 and "warning" in log and "--tokenizer" in log and
           os.path.exists("hf_gone/model.safetensors") and not os.path.exists("hf_gone/tokenizer.json"), log[-300:])
    # --tokenizer names it instead
    rc, log = run("convert", ck, "--hf", "hf_gone", "--tokenizer", "tiktoken:ranks.tiktoken")
    ok = rc == 0 and os.path.exists("hf_gone/tokenizer.json")
    if ok:
        a, b = AutoTokenizer.from_pretrained("hf_gone"), AutoTokenizer.from_pretrained("hf_tiktoken")
        ok = all(a(t)["input_ids"] == b(t)["input_ids"] for t in texts)
    result("hf_tokenizer_override", ok, log[-300:])
    # a tokenizer larger than the model is refused (the hf one has 3 ids fewer)
    rc, log = run("convert", "ck_hf", "--hf", "hf_gone", "--tokenizer", "tiktoken:ranks.tiktoken")
    result("hf_tokenizer_override_too_large", rc == 1 and "ids but the model only" in log, log[-300:])
sys.exit(1 if tok_common.failed else 0)
