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
# generation (tools/generate) from the trained checkpoint: English-like
# text (the same model after one step: 46% of 1000 bytes printable), a
# seed repeats its text and another seed does not, and the greedy
# continuation depends neither on the token padding the window after the
# text (the model is causal; reading the wrong row would see it) nor on
# text beyond the context (cropped to the last 64 tokens, as nanoGPT does)
# verdict STATUS OK_TEXT FAIL_TEXT: a cmocka-style line, counted
verdict() {
  if [ "$1" = 0 ]; then echo "[       OK ] charlm: $2"; passed=$((passed + 1))
  else echo "[  FAILED  ] charlm: $3"; failed=$((failed + 1)); fi
}
gen() { tools/generate examples/charlm.ini "$T/charlm/checkpoint.safetensors" data.path="$T/data/fortunes_train_*.bin" \
          eval_data.path="$T/data/fortunes_val_000000.bin" "$@"; }
frac=$(gen --prompt "The " --tokens 1000 --seed 1 2> "$T/gen.err" | python3 -c '
import sys
d = sys.stdin.buffer.read()[4:-1]  # the prompt and the closing newline left out
print("%d %.4f" % (len(d), sum(32 <= b < 127 or b in (9, 10) for b in d) / max(len(d), 1)))')
[ "${frac%% *}" = 1000 ] && awk -v f="${frac#* }" 'BEGIN { exit !(f >= 0.95) }'
verdict $? "generate: 1000 bytes at temperature 0.8, ${frac#* } of them printable (>= 0.95)" \
  "generate: '$frac' (bytes, printable fraction; needs 1000 and >= 0.95): $(tail -3 "$T/gen.err")"
a=$(gen --prompt "A " --tokens 64 --seed 7 --ids) b=$(gen --prompt "A " --tokens 64 --seed 7 --ids)
c=$(gen --prompt "A " --tokens 64 --seed 8 --ids)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && [ "$(echo "$a" | wc -l)" = 64 ]
verdict $? "generate: seed 7 twice gives one text, seed 8 another" \
  "generate: seeds: 7 '$(echo $a | head -c 80)', 7 again '$(echo $b | head -c 80)', 8 '$(echo $c | head -c 80)'"
# from the checkpoint alone (the config it carries) and with the shards' paths pointing nowhere: the same text
d=$(tools/generate "$T/charlm/checkpoint.safetensors" --prompt "A " --tokens 64 --seed 7 --ids 2> "$T/gen_own.err")
e=$(tools/generate examples/charlm.ini "$T/charlm/checkpoint.safetensors" data.path=/nonexistent/x_train_*.bin \
      eval_data.path=/nonexistent/x_val_000000.bin --prompt "A " --tokens 64 --seed 7 --ids 2>> "$T/gen_own.err")
[ -n "$a" ] && [ "$d" = "$a" ] && [ "$e" = "$a" ]
verdict $? "generate: the checkpoint alone, and the INI with no shards there, give seed 7's text" \
  "generate: own config '$(echo $d | head -c 80)', no shards '$(echo $e | head -c 80)': $(tail -3 "$T/gen_own.err")"
# --tokens 0 prints the prompt as it is; --prompt with --prompt-file is refused
z=$(tools/generate "$T/charlm/checkpoint.safetensors" --prompt "As is" --tokens 0 2> "$T/gen_z.err")
both=$(tools/generate "$T/charlm/checkpoint.safetensors" --prompt "x" --prompt-file examples/charlm.ini 2>&1) && both=ran
[ "$z" = "As is" ] && [[ "$both" == *"--prompt and --prompt-file both given"* ]]
verdict $? "generate: --tokens 0 prints the prompt; --prompt with --prompt-file refused" \
  "generate: --tokens 0 gave '$z'; both prompts: '$both'"
long="$(head -c 300 /usr/share/games/fortunes/fortunes | tr -cd '[:print:]\n' | head -c 100)"
g0=$(gen --prompt "The cat " --tokens 24 --temperature 0 --ids --pad 0) g1=$(gen --prompt "The cat " --tokens 24 --temperature 0 --ids --pad 101)
l100=$(gen --prompt "$long" --tokens 24 --temperature 0 --ids) l64=$(gen --prompt "${long: -64}" --tokens 24 --temperature 0 --ids)
[ -n "$g0" ] && [ "$g0" = "$g1" ] && [ -n "$l100" ] && [ "$l100" = "$l64" ]
verdict $? "generate: greedy text the same with pad token 0 or 101, and from 100 bytes or their last 64" \
  "generate: pad 0 '$(echo $g0)' / pad 101 '$(echo $g1)'; 100 bytes '$(echo $l100)' / last 64 '$(echo $l64)'"
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
# checkpoints across float precisions (as PyTorch's load_state_dict copies):
# tiny_a's weights rewritten as F64 (exact) give the f32 file's greedy text
# bit for bit; as BF16 (a bf16 GPU run's file) they load with a note and
# training resumes from them; as BF16 with the fp32 master copies a bf16 run
# also writes, the fp32 model takes the masters: resumed, steps 7-8 have the
# losses of the run resumed from the f32 file, where BF16 alone does not
for d in F64 BF16; do python3 tests/e2e/ckpt_dtype.py "$T/tiny_a/checkpoint.safetensors" "$T/tiny_$d.safetensors" $d; done
python3 tests/e2e/ckpt_dtype.py "$T/tiny_a/checkpoint.safetensors" "$T/tiny_BF16M.safetensors" BF16 --master
overrides=${tiny#examples/charlm.ini}
tg() { tools/generate examples/charlm.ini "$1" $overrides --prompt "The " --tokens 12 --temperature 0 --ids 2> "$T/tg.err"; }
f32=$(tg "$T/tiny_a/checkpoint.safetensors") f64=$(tg "$T/tiny_F64.safetensors") b16=$(tg "$T/tiny_BF16.safetensors")
note=$(grep -c "converted from the file's BF16 to the model's F32" "$T/tg.err")
for d in a BF16 BF16M; do
  ck="$T/tiny_$d.safetensors"; [ $d = a ] && ck="$T/tiny_a/checkpoint.safetensors"
  tools/train $tiny run.steps=8 run.out_dir="$T/tiny_r$d" run.resume="$ck" > "$T/tiny_r$d.log" 2>&1 || echo "resume from $d: rc $?"
done
losses78() { sed -n 's/^{"step": \([78]\),.*"loss": \([0-9.e+-]*\),.*/\1 \2/p' "$T/tiny_r$1/metrics.jsonl"; }
ra=$(losses78 a) rb=$(losses78 BF16) rm=$(losses78 BF16M)
mnote=$(grep -c "parameters taken from the file's fp32 master copies" "$T/tiny_rBF16M.log")
[ -n "$f32" ] && [ "$f32" = "$f64" ] && [ "$(echo "$b16" | wc -l)" = 12 ] && [ "$note" = 1 ] &&
  [ "$(echo "$ra" | wc -l)" = 2 ] && [ "$(echo "$rb" | wc -l)" = 2 ] && [ "$rm" = "$ra" ] && [ "$rb" != "$ra" ] && [ "$mnote" = 1 ]
verdict $? "checkpoints in F64 and BF16 load into the fp32 model (F64: the same greedy text; BF16: resumed; BF16 with fp32 masters: resumed with the f32 file's losses $(echo $ra), BF16 alone $(echo $rb))" \
  "dtypes: f32 '$(echo $f32)' f64 '$(echo $f64)' bf16 '$(echo $b16)', note $note; resumed steps 7-8 from f32 '$(echo $ra)', bf16 '$(echo $rb)', bf16 + masters '$(echo $rm)' (master note $mnote): $(tail -2 "$T/tiny_rBF16M.log")"
[ $passed -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ $failed -gt 0 ] && echo "[  FAILED  ] $failed test(s), listed above"
[ $failed -eq 0 ]
