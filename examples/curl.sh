#!/usr/bin/env bash
# The curl walkthrough of docs/getting-started.md, runnable. With `ftq up` (or `make up`) serving on
# 127.0.0.1:$FTQ_PORT:
#
#   examples/curl.sh
#
# FTQ_URL (default http://127.0.0.1:$FTQ_PORT, 8000 unless set) and FTQ_TOKEN (sent as a bearer token when set) are read
# as the CLI reads them. Needs bash, curl and python3 (for reading JSON). Exits 0 when the tiny job
# succeeds.
set -euo pipefail
cd "$(dirname "$0")/.."

URL="${FTQ_URL:-http://127.0.0.1:${FTQ_PORT:-8000}}"
URL="${URL%/}"
AUTH=()
if [ -n "${FTQ_TOKEN:-}" ]; then
  AUTH=(-H "Authorization: Bearer ${FTQ_TOKEN}")
fi

# curl that prints the server's error body and fails on 4xx/5xx.
api() {
  local body status
  body=$(curl -sS "${AUTH[@]}" -w '\n%{http_code}' "$@") || { echo "curl failed: is ftq up at $URL?" >&2; exit 3; }
  status=${body##*$'\n'}
  body=${body%$'\n'*}
  if [ "$status" -ge 400 ]; then
    echo "HTTP $status: $body" >&2
    exit 1
  fi
  printf '%s' "$body"
}
# field EXPR: evaluates a Python expression over the JSON document `d` read from stdin.
field() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

echo "== 1. dry run: what the Falcon 180B article job renders to (nothing is stored or launched)"
api -X POST "$URL/jobs?dry_run=true" -H 'Content-Type: application/yaml' \
  --data-binary @examples/falcon-180b-lora-zero3.yaml \
  | field '"\n".join(["accelerate config:", d["accelerate_config_yaml"].rstrip(), "", "command: " + " ".join(d["command"])])'

echo
echo "== 2. submit examples/tiny-cpu.yaml as YAML"
JOB=$(api -X POST "$URL/jobs" -H 'Content-Type: application/yaml' --data-binary @examples/tiny-cpu.yaml \
  | field 'd["id"]')
echo "job id: $JOB    dashboard: $URL/ui/jobs/$JOB"

echo
echo "== 3. status"
api "$URL/jobs/$JOB" | field '"{} {} step {}/{}".format(d["id"], d["status"], d["progress"]["step"] or 0, d["progress"]["max_steps"])'

echo
echo "== 4. cancel: a second copy, cancelled at once (cancel is idempotent)"
OTHER=$(api -X POST "$URL/jobs" -H 'Content-Type: application/yaml' --data-binary @examples/tiny-cpu.yaml \
  | field 'd["id"]')
api -X POST "$URL/jobs/$OTHER/cancel" | field 'd["id"] + ": " + d["status"]'
api -X POST "$URL/jobs/$OTHER/cancel" | field 'd["id"] + ": " + d["status"] + " (asked again)"'

echo
echo "== 5. logs, read by byte offset until the job ends"
offset=0
deadline=$((SECONDS + ${CURL_SH_TIMEOUT:-900}))
while :; do
  status=$(api "$URL/jobs/$JOB" | field 'd["status"]')
  chunk=$(api "$URL/jobs/$JOB/logs?offset=$offset&limit=65536")
  printf '%s' "$chunk" | python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["text"])'
  offset=$(printf '%s' "$chunk" | field 'd["next_offset"]')
  complete=$(printf '%s' "$chunk" | field 'd["complete"]')
  if [ "$complete" = "True" ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "gave up waiting for $JOB (status $status)" >&2
    exit 1
  fi
  sleep 2
done

echo
echo "== 6. metrics: every point after step -1 (a client polls with after_step=<last step seen>)"
fmt() { python3 -c 'import json, sys
for p in json.load(sys.stdin)["data"]:
    cell = lambda v, f: "-" if v is None else f % v
    print("%5d  %9s  %9s  %13s" % (p["step"], cell(p["loss"], "%.4f"), cell(p["eval_loss"], "%.4f"),
                                   cell(p["learning_rate"], "%.3e")))'; }
printf '%5s  %9s  %9s  %13s\n' step loss eval_loss learning_rate
api "$URL/jobs/$JOB/metrics?after_step=-1" | fmt

echo
echo "== 7. final status"
api "$URL/jobs/$JOB" | field 'd["id"] + " " + d["status"] + (" " + json.dumps(d["error"]) if d["error"] else "")'
[ "$(api "$URL/jobs/$JOB" | field 'd["status"]')" = "succeeded" ]
