#!/bin/bash
# Compares build/bench/expr with the reference JSONata (npm jsonata@2.2.2)
# on the same expressions and payload; prints evals/s for both and the ratio.
# Installs the reference into a temporary folder; bounded in time.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bench/expr"
[ -x "$BIN" ] || { echo "expr bench: $BIN not built (make $BIN)"; exit 1; }
tmp=$(mktemp -d /tmp/expr-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$BIN" --dump >"$tmp/cases.txt"
if ! (cd "$tmp" && timeout 180 npm install --silent --no-audit --no-fund jsonata@2.2.2 >/dev/null 2>&1); then
  echo "expr bench: could not install jsonata@2.2.2 from npm; C figures only"
  "$BIN"
  exit 0
fi
cat >"$tmp/bench.js" <<'JS'
const fs = require('fs');
const jsonata = require(process.argv[2] + '/node_modules/jsonata');
const lines = fs.readFileSync(process.argv[2] + '/cases.txt', 'utf8').trim().split('\n');
const payload = JSON.parse(lines[0]);
(async () => {
  for (const line of lines.slice(1)) {
    const [name, src] = line.split('\t');
    const x = jsonata(src);
    for (let i = 0; i < 2000; i++) await x.evaluate(payload);   // warm up
    let n = 0; const t0 = process.hrtime.bigint(); let t;
    do {
      for (let i = 0; i < 500; i++) await x.evaluate(payload);
      n += 500; t = process.hrtime.bigint();
    } while (Number(t - t0) < 1e9);
    console.log(name + ' ' + Math.round(n / (Number(t - t0) / 1e9)));
  }
})();
JS
timeout 60 node "$tmp/bench.js" "$tmp" >"$tmp/node.txt"
timeout 60 "$BIN" >"$tmp/c.txt"
printf '%-10s %14s %14s %8s\n' expr "C evals/s" "node evals/s" ratio
join <(sort "$tmp/c.txt") <(sort "$tmp/node.txt") | while read -r name c js; do
  awk -v n="$name" -v c="$c" -v j="$js" 'BEGIN { printf "%-10s %14d %14d %7.1fx\n", n, c, j, c / j }'
done
