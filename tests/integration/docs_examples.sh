#!/usr/bin/env bash
# Docs that run: every ```sh block of README.md and docs/*.md is executed, so a
# documented command cannot fail unnoticed. Blocks of one file run in order
# (bash -e) in one fresh directory that holds, as `make quickstart` leaves a
# checkout: ./mtrain (also on PATH), recipes/, scripts/ and the synthetic
# corpus data/tiny. Examples that cannot run here (another machine's files, a
# cluster, the full suite) are written as indented or ```text blocks instead.
#
# Tiny substitutions, so that the whole file runs in seconds on 2 cores:
#   - `pretrain RECIPE` and `mpirun.sh NP RECIPE` train 2 steps (`--set
#     train.steps=2 --set optimizer.warmup_steps=1` right after the recipe; a
#     documented train.steps=N becomes 2 as well);
#   - `data generate` writes 50 documents unless the example says --docs.
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$TMP/bin"
ln -s "$MTRAIN" "$TMP/bin/mtrain"
export PATH="$TMP/bin:$PATH" MTRAIN

"$PY" - "$ROOT" "$TMP/blocks" <<'EOF' || { fail docs_examples_extract "cannot extract the examples"; exit 1; }
import os, re, sys
root, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
docs = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
for doc in docs:
    lines = open(os.path.join(root, doc), encoding="utf-8").read().split("\n")
    n, block, start = 0, None, 0
    for i, line in enumerate(lines, 1):
        if block is None and re.fullmatch(r"```sh\s*", line):
            block, start = [], i
        elif block is not None and line.startswith("```"):
            n += 1
            text = "\n".join(block)
            text = re.sub(r"train\.steps=\d+", "train.steps=2", text)
            text = re.sub(r"((\bpretrain|\bmpirun\.sh\s+(?:--shared-gpu\s+)?\d+)\s+\S+\.yaml)", r"\1 --set train.steps=2 --set optimizer.warmup_steps=1", text)
            text = re.sub(r"(\bdata generate\b(?![^\n]*--docs))", r"\1 --docs 50", text)
            name = "%s__%03d__L%d.sh" % (doc.replace("/", "_"), n, start)
            open(os.path.join(out, name), "w").write(text + "\n")
            block = None
        elif block is not None:
            block.append(line)
EOF

count=0
for doc in README.md "$ROOT"/docs/*.md; do
    doc=${doc#"$ROOT"/}
    key=${doc//\//_}
    ls "$TMP/blocks/${key}__"* >/dev/null 2>&1 || continue
    work="$TMP/work/$key"
    mkdir -p "$work"
    ln -s "$MTRAIN" "$work/mtrain"
    ln -s "$ROOT/recipes" "$work/recipes"
    ln -s "$ROOT/scripts" "$work/scripts"
    (cd "$work" && "$MTRAIN" data generate --out data/tiny --docs 200 >/dev/null) || { fail "docs $doc" "cannot make data/tiny"; continue; }
    for b in "$TMP/blocks/${key}__"*; do
        line=${b##*__L}; line=${line%.sh}
        count=$((count + 1))
        if (cd "$work" && OMP_NUM_THREADS=1 timeout 300 bash -e "$b") >"$TMP/out" 2>&1; then
            pass "docs $doc:$line"
        else
            fail "docs $doc:$line" "the example failed: $(tail -c 600 "$TMP/out")"
        fi
    done
done
[ "$count" -gt 0 ] && pass "docs_examples_found ($count blocks)" || fail docs_examples_found "no \`\`\`sh blocks in README.md or docs/"
exit $FAILED
