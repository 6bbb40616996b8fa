#!/usr/bin/env bash
# tests/e2e/charlm_test.sh: the byte-level GPT on real English text, on the
# CPU, as a user runs it: convert Debian's fortunes with tools/convert text,
# train examples/charlm.ini for a few minutes, and check that the validation
# loss is below the bigram conditional entropy H(x_t | x_{t-1}) of the
# training split, computed here from the shard: a model that only knew the
# previous byte could not get below it, so the model uses more context.
# Also checks the checkpoint's tensor names are nanoGPT's GPT state_dict
# (what load_state_dict(strict=True) needs). Prints cmocka-style lines.
set -uo pipefail
F=/usr/share/games/fortunes
T="${TEST_TMPDIR:-$(mktemp -d)}"
if [ ! -d "$F" ]; then
  echo "FAIL: $F is missing: apt-get install fortunes (tools/setup.sh does)"
  echo "[  FAILED  ] 2 test(s)"
  exit 1
fi
tools/convert text --input "$F" --out "$T/data/fortunes" --force || exit 1
# H(next byte | byte) of the training shard, in nats (plug-in estimate)
bigram=$(python3 - "$T/data/fortunes_train_000001.bin" <<'PY'
import math, sys
from collections import Counter
d = open(sys.argv[1], "rb").read()[1024:]
t = [d[i] | d[i + 1] << 8 for i in range(0, len(d), 2)]
pairs = Counter(zip(t, t[1:]))
firsts = Counter(t[:-1])
n = len(t) - 1
print("%.6f" % (-sum(c * math.log(c / firsts[a]) for (a, b), c in pairs.items()) / n))
PY
) || { echo "[  FAILED  ] computing the bigram entropy"; exit 1; }
passed=0
failed=0
start=$(date +%s)
tools/train examples/charlm.ini data.path="$T/data/fortunes_train_*.bin" eval_data.path="$T/data/fortunes_val_000000.bin" \
  run.out_dir="$T/charlm" run.progress=lines > "$T/charlm.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
loss=$(sed -n 's/.*"summary".*"eval_loss": \([0-9.]*\).*/\1/p' "$T/charlm/metrics.jsonl" 2>/dev/null)
if [ $rc -eq 0 ] && [ -n "$loss" ] && awk -v a="$loss" -v h="$bigram" 'BEGIN { exit !(a < h) }'; then
  echo "[       OK ] charlm: validation loss $loss < bigram conditional entropy $bigram nats, in ${secs} s"
  passed=$((passed + 1))
else
  echo "[  FAILED  ] charlm: rc=$rc, validation loss '${loss}' (needs < $bigram), ${secs} s"
  tail -20 "$T/charlm.log"
  failed=$((failed + 1))
fi
# the checkpoint's names: nanoGPT's GPT(n_layer=4).state_dict() keys, exactly
names=$(python3 - "$T/charlm/checkpoint.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
got = sorted(k for k in h if k != "__metadata__" and not k.startswith("optimizer."))
want = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias",
        "lm_head.weight"]
for l in range(4):
    for p in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]:
        want += ["transformer.h.%d.%s.weight" % (l, p), "transformer.h.%d.%s.bias" % (l, p)]
shapes = {"transformer.wte.weight": [256, 128], "lm_head.weight": [256, 128], "transformer.wpe.weight": [64, 128],
          "transformer.h.0.attn.c_attn.weight": [384, 128], "transformer.h.0.mlp.c_proj.weight": [128, 512]}
bad = [k for k, s in shapes.items() if h.get(k, {}).get("shape") != s]
print("ok" if got == sorted(want) and not bad else "names %s, shapes wrong: %s" % (sorted(set(got) ^ set(want)), bad))
PY
)
if [ "$names" = "ok" ]; then
  echo "[       OK ] charlm: checkpoint tensors are nanoGPT's state_dict names and shapes"
  passed=$((passed + 1))
else
  echo "[  FAILED  ] charlm: checkpoint: $names"
  failed=$((failed + 1))
fi
# resume: a tiny gpt stopped at step 3 and resumed gives the losses of the
# uninterrupted run (the tied weight's two names load back)
tiny="examples/charlm.ini data.path=$T/data/fortunes_train_*.bin eval_data.path=$T/data/fortunes_val_000000.bin
      eval_data.seq_len=16 eval_data.batch_size=4 eval_data.length=8 data.seq_len=16 data.batch_size=4
      model.n_layer=1 model.n_embd=32 model.n_head=2 model.context=16 optimizer.warmup_epochs=0 optimizer.schedule=constant
      run.log_every=1
      run.progress=lines"
tools/train $tiny run.steps=6 run.out_dir="$T/tiny_a" > "$T/tiny_a.log" 2>&1
tools/train $tiny run.steps=3 run.out_dir="$T/tiny_b" > "$T/tiny_b.log" 2>&1
tools/train $tiny run.steps=6 run.out_dir="$T/tiny_c" run.resume="$T/tiny_b/checkpoint.safetensors" > "$T/tiny_c.log" 2>&1
losses() { sed -n 's/^{"step": \([456]\),.*"loss": \([0-9.e+-]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }
a=$(losses "$T/tiny_a") c=$(losses "$T/tiny_c")
if [ -n "$a" ] && [ "$a" = "$c" ]; then
  echo "[       OK ] charlm: resumed at step 3, steps 4-6 have the uninterrupted run's losses ($(echo $a | tr '\n' ' '))"
  passed=$((passed + 1))
else
  echo "[  FAILED  ] charlm: resume: uninterrupted '$a', resumed '$c'"
  tail -5 "$T/tiny_c.log"
  failed=$((failed + 1))
fi
[ $passed -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ $failed -gt 0 ] && echo "[  FAILED  ] $failed test(s), listed above"
[ $failed -eq 0 ]
