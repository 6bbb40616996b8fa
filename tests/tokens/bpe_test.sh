#!/usr/bin/env bash
# tests/tokens/bpe_test.sh: tools/convert text --tokenizer gpt2 against npm's
# gpt-3-encoder@1.1.4 (its encode(), run with node) on texts with unicode,
# whitespace runs, contractions, numbers and punctuation: the token ids must
# be the same, in order. The package is fetched with `npm pack` (its
# encoder.json and vocab.bpe are GPT-2's published files); the byte-level
# tokenizer is checked too (ids = the bytes), and decoding each text's ids
# (tests/tokens/bpe_roundtrip: tools/generate's printing) gives it back.
set -euo pipefail
convert="$PWD/tools/convert"
roundtrip="$PWD/tests/tokens/bpe_roundtrip"
train="$PWD/tools/train" generate="$PWD/tools/generate"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$tmp"
for tool in node npm od; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (tools/setup.sh installs node and npm)"; exit 1; }
done
if [ ! -f package/encoder.json ]; then
  npm pack gpt-3-encoder@1.1.4 >npm.log 2>&1 || npm pack gpt-3-encoder@1.1.4 >npm.log 2>&1 ||
    { cat npm.log; echo "FAIL: npm pack gpt-3-encoder@1.1.4"; exit 1; }
  tar xzf gpt-3-encoder-1.1.4.tgz
fi
mkdir -p texts
printf '%s' "Hello world! It's a test: we've got 12345 numbers, they'll see; I'm sure you'd agree." > texts/1_contractions.txt
printf 'Tabs\tand   runs   of    spaces\n\n\n  leading and trailing   \n' > texts/2_whitespace.txt
printf '%s' "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский текст, emoji 😀👍🏽 and — dashes “quotes”." > texts/3_unicode.txt
printf '%s' "Mixed123abc 3.14159 x=y+z; foo_bar(baz) {\"json\": [1, 2]} https://example.com/a?b=c#d  ''' \"\"" > texts/4_code.txt
printf '%s' "DON'T SHOUT'S 'quoted' O'Neil's rock'n'roll  'll 've 're" > texts/5_apostrophes.txt
# long words (tools/bpe.c merges through a heap, not encoder.py's rescans): 4,000 pseudo-random letters, runs of
# one letter, of a pair and of digits, where the left-to-right rule for overlapping pairs decides
node -e 'let x = 12345, s = ""; const a = "etaoinshrdlucmETAO";
         for (let i = 0; i < 4000; i++) { x = (x * 1103515245 + 12345) % 2147483648; s += a[x % a.length]; }
         process.stdout.write(s)' > texts/6_long_word.txt
node -e 'process.stdout.write("a".repeat(501) + " " + "ab".repeat(300) + "a " + "1".repeat(301) + " " +
         "ooo".repeat(100) + " xXx".repeat(50))' > texts/7_runs.txt
passed=0
failed=0
for f in texts/*.txt; do
  name=$(basename "$f" .txt)
  want=$(node -e 'const {encode} = require(process.argv[1]); const fs = require("fs");
                  console.log(encode(fs.readFileSync(process.argv[2], "utf8")).join(" "))' "$tmp/package/index.js" "$f")
  "$convert" text --tokenizer gpt2 --encoder package/encoder.json --bpe package/vocab.bpe --val 0 \
    --input "$f" --out "out/$name" --force >/dev/null
  # the shard: a 1024-byte header, then <|endoftext|> (50256) and the text's ids
  got=$(od -An -tu2 -v -j1024 "out/${name}_train_000001.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  first=${got%% *}
  got=${got#* }
  if [ "$first" = "50256" ] && [ "$got" = "$want" ]; then
    passed=$((passed + 1))
    echo "ok: $name ($(echo $want | wc -w) tokens)"
  else
    failed=$((failed + 1))
    echo "FAIL: $name"
    echo "  gpt-3-encoder: $want"
    echo "  convert:       $first $got"
  fi
  # decoding (tools/generate's output): the ids give the text back
  if back=$("$roundtrip" package/encoder.json package/vocab.bpe "$f"); then
    passed=$((passed + 1))
    echo "ok: $name decodes back ($back)"
  else
    failed=$((failed + 1))
    echo "FAIL: $name: decode: $back"
  fi
done
# bytes that are not UTF-8 (Latin-1 text, a lone continuation byte, a cut sequence at the end) pass as bytes: no
# pattern matches them, and they used to be dropped; decoding must give every byte back
mkdir -p raw
printf 'caf\xe9 ok, na\xefve' > raw/latin1.txt
printf 'ok \xff\xfe\xfd and \x80 alone' > raw/invalid.txt
printf 'cut at the end \xe6\x97' > raw/cut.txt
for f in raw/*.txt; do
  name=$(basename "$f" .txt)
  if back=$("$roundtrip" package/encoder.json package/vocab.bpe "$f"); then
    passed=$((passed + 1)); echo "ok: invalid UTF-8 $name decodes back ($back)"
  else
    failed=$((failed + 1)); echo "FAIL: invalid UTF-8 $name: $back"
  fi
done
# a word of 300,000 letters: encoded (encoder.py's bpe() is quadratic in the word: hours) and decoded back
node -e 'let x = 7, s = ""; for (let i = 0; i < 300000; i++) { x = (x * 1103515245 + 12345) % 2147483648;
         s += "etaoinshrdlu"[x % 12]; } process.stdout.write(s)' > raw_long.txt
if back=$(timeout 120 "$roundtrip" package/encoder.json package/vocab.bpe raw_long.txt); then
  passed=$((passed + 1)); echo "ok: a word of 300,000 letters decodes back ($back)"
else
  failed=$((failed + 1)); echo "FAIL: a word of 300,000 letters: $back"
fi
# vocab.bpe with CR LF line endings (a copy made on Windows): the same ids, not one token a byte
sed 's/$/\r/' package/vocab.bpe > vocab_crlf.bpe
"$convert" text --tokenizer gpt2 --encoder package/encoder.json --bpe vocab_crlf.bpe --val 0 \
  --input texts/1_contractions.txt --out out/crlf --force >/dev/null
if cmp -s out/crlf_train_000001.bin out/1_contractions_train_000001.bin; then
  passed=$((passed + 1)); echo "ok: vocab.bpe with CR LF gives the same ids"
else
  failed=$((failed + 1)); echo "FAIL: vocab.bpe with CR LF gives other ids"
fi
# tools/generate with GPT-2's BPE: a tiny gpt of vocabulary 50257 trained 2
# steps on one text's shard; the prompt is encoded and the new ids decoded
# (the output starts with the prompt and goes on); without the tokenizer
# files it is refused, naming [data] vocab
printf '%s\n' "[run]" "backends = cpu" "steps = 2" "progress = off" "out_dir = $tmp/gen_run" \
  "[data]" "source = tokens" "path = out/1_contractions_train_*.bin" "seq_len = 8" "vocab = 50257" \
  "batch_size = 2" "workers = 1" "[model]" "name = gpt" "n_layer = 1" "n_head = 2" "n_embd = 32" "context = 8" \
  "[optimizer]" "name = adamw" "lr = 1e-3" > bpe.ini
rm -rf gen_run
"$train" bpe.ini > gen_train.log 2>&1 || cat gen_train.log
out=$("$generate" bpe.ini gen_run/checkpoint.safetensors --encoder package/encoder.json --vocab-bpe package/vocab.bpe \
  --prompt "Hello world" --tokens 6 --seed 1 2> gen.err) || out="$out $(cat gen.err)" # the text is stdout alone
# an override may come before the checkpoint, as train takes them anywhere: the same text
out2=$("$generate" bpe.ini run.progress=off gen_run/checkpoint.safetensors --encoder package/encoder.json --vocab-bpe \
  package/vocab.bpe --prompt "Hello world" --tokens 6 --seed 1 2> gen2.err) || out2="$out2 $(cat gen2.err)"
# refused: exit status 1, expected (set -e)
refused=$("$generate" bpe.ini gen_run/checkpoint.safetensors --prompt "Hello world" --tokens 6 2>&1) || true
if [[ "$out" == "Hello world"?* ]] && [ "$out2" = "$out" ] && [[ "$refused" == *"[data] vocab = 50257"*"--encoder"* ]]; then
  passed=$((passed + 1)); echo "ok: generate with GPT-2's BPE: '$out'"
else
  failed=$((failed + 1)); echo "FAIL: generate with GPT-2's BPE: '$out'; an override first: '$out2'; without the files: '$refused'"
fi
# a set of shards is replaced whole: without --force a second conversion is refused before it writes anything;
# with --force the earlier set's shards it does not write again are removed (the tokens source's glob would
# train on them); an empty input is an error, not a set of empty shards
"$convert" text --input texts/3_unicode.txt --val 0.2 --shard-tokens 40 --out out/set >/dev/null
before=$(ls out/set_* | wc -l)
again=$("$convert" text --input texts/1_contractions.txt --val 0.5 --shard-tokens 1000 --out out/set 2>&1) && again=ok
"$convert" text --input texts/1_contractions.txt --val 0 --shard-tokens 1000 --out out/set --force >/dev/null
after=$(ls out/set_*)
: > texts_empty.txt
empty=$("$convert" text --input texts_empty.txt --out out/empty 2>&1) && empty=ok
if [ "$before" -gt 3 ] && [[ "$again" == *"exists (a shard of an earlier conversion"*"--force"* ]] &&
   [ "$after" = "out/set_train_000001.bin" ] && [[ "$empty" == *"gave no tokens"* ]] && ! ls out/empty_* 2>/dev/null; then
  passed=$((passed + 1)); echo "ok: shard sets replaced whole ($before files, then 1), an empty input refused"
else
  failed=$((failed + 1)); echo "FAIL: shard sets: $before files before; without --force: '$again'; after: '$after'; empty: '$empty'"
fi
# numbers generate cannot take: out of range, past its cap, or not numbers at all (they used to overflow its
# buffer of new tokens)
bad=0
for arg in "--tokens 99999999999999999999" "--tokens 4611686018427387904" "--temperature nan" "--temperature inf"; do
  # shellcheck disable=SC2086
  msg=$("$generate" bpe.ini gen_run/checkpoint.safetensors --encoder package/encoder.json --vocab-bpe package/vocab.bpe \
    --prompt "Hi" $arg 2>&1) && bad=1
  [[ "$msg" == *"wants a number >= 0"* ]] || bad=1
done
if [ $bad = 0 ]; then passed=$((passed + 1)); echo "ok: generate refuses out-of-range numbers"
else failed=$((failed + 1)); echo "FAIL: generate took an out-of-range number: '$msg'"; fi
# a validation split larger than one shard goes into several (PREFIX_val_000000.bin, 000001, ...), each at most
# --shard-tokens, together the file's last bytes in order (one shard whose int32 count could not hold it was refused)
"$convert" text --input texts/6_long_word.txt --val 0.5 --shard-tokens 900 --out out/vsplit --force >/dev/null
vals=$(ls out/vsplit_val_*.bin | tr '\n' ' ')
got=$(for f in out/vsplit_val_*.bin; do od -An -tu2 -v -j1024 "$f"; done | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
want=$(tail -c 2000 texts/6_long_word.txt | od -An -tu1 -v | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
if [ "$vals" = "out/vsplit_val_000000.bin out/vsplit_val_000001.bin out/vsplit_val_000002.bin " ] && [ "$got" = "$want" ]; then
  passed=$((passed + 1)); echo "ok: a validation split in 3 shards"
else
  failed=$((failed + 1)); echo "FAIL: validation split shards: $vals"
fi
# byte level: the ids are the file's bytes
"$convert" text --input texts/3_unicode.txt --val 0 --out out/bytes --force >/dev/null
got=$(od -An -tu2 -v -j1024 out/bytes_train_000001.bin | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
want=$(od -An -tu1 -v texts/3_unicode.txt | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
if [ "$got" = "$want" ]; then passed=$((passed + 1)); echo "ok: byte-level"; else failed=$((failed + 1)); echo "FAIL: byte-level"; fi
echo "[==========] $((passed + failed)) test(s) run."
[ "$failed" -eq 0 ] && echo "[  PASSED  ] $passed test(s)." || { echo "[  FAILED  ] $failed test(s), listed above"; exit 1; }
