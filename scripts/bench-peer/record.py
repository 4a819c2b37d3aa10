#!/usr/bin/env python3
"""One run of a peer row in scripts/bench, as JSON: what the load tool measured (wrk's WRKJSON line,
or a loadgen report), what Redis spent meanwhile, and whether the answers were right.

  record.py OUT --expect winners|refused --wrk FILE | --loadgen FILE --upstream HOST:PORT
            [--redis-before "cpu_us script_us script_calls" --redis-after "..."]
            [--code "410 sold_out"] [--exact-winners N] [--peer-secret S --peer-users N --peer-sold N]
            [--upstream-cpu-us N]

Correctness (`correct`, the run fails on false):
  refused  no request reached the upstream; wrk: every answer non-2xx; loadgen: every answer `--code`
  winners  wrk: every answer 2xx and upstream requests in [2xx, 2xx + connections] (wrk drops the
           answers still in flight when it stops); loadgen: upstream requests == 200 answers
  --exact-winners: exactly this many requests reached the upstream (a sale that sells out)
  always: the upstream answered no request 403 for a bad signature (its /__upstream/grants
           `rejected`, when it verifies: scripts/bench starts it with --verify-secret and
           --peer-secret)
  --peer-secret: every upstream request carries a valid HMAC-SHA256 grant for its own buyer, no
           buyer twice, and their count equals the Redis users-set growth (--peer-users) and the
           stock taken (--peer-sold)
"""
import argparse, base64, hashlib, hmac, json, sys, urllib.request

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--expect", choices=["winners", "refused"], required=True)
p.add_argument("--wrk")
p.add_argument("--loadgen")
p.add_argument("--upstream", required=True)
p.add_argument("--connections", type=int, default=64)
p.add_argument("--redis-before")
p.add_argument("--redis-after")
p.add_argument("--code")
p.add_argument("--exact-winners", type=int)
p.add_argument("--peer-secret")
p.add_argument("--peer-users", type=int)
p.add_argument("--peer-sold", type=int)
p.add_argument("--upstream-cpu-us", type=int, help="the upstream's CPU during the run (kept as upstream_cpu_us)")
p.add_argument("--gateway-cpu-us", type=int, help="flashgate's CPU during the run (kept as gateway_cpu_us; a peer or floor run's is flashgate idling)")
a = p.parse_args()

r, check = {}, []
if a.wrk:
    line = next((l for l in open(a.wrk) if l.startswith("WRKJSON ")), None)
    if line is None:
        sys.exit(f"record.py: no WRKJSON line in {a.wrk}:\n{open(a.wrk).read()}")
    w = json.loads(line[len("WRKJSON "):])
    secs = max(w["duration_us"], 1) / 1e6
    r = {"tool": "wrk", "requests": w["requests"], "elapsed_secs": secs,
         "throughput_rps": w["requests"] / secs, "p50_ms": w["p50_ms"], "p99_ms": w["p99_ms"],
         "errors": w["connect_errors"] + w["read_errors"] + w["write_errors"] + w["timeouts"],
         "status_errors": w["status_errors"]}
    ok2xx = w["requests"] - w["status_errors"]
else:
    r = json.load(open(a.loadgen))
    r["tool"] = "loadgen"
    r["status_errors"] = sum(v for k, v in r["outcomes"].items() if not k.startswith("2"))
    ok2xx = r["outcomes"].get("200", 0)

if a.redis_before and a.redis_after:
    b, e = [list(map(int, s.split())) for s in (a.redis_before, a.redis_after)]
    r["redis_cpu_us"], r["script_us"], r["script_calls"] = (y - x for x, y in zip(b, e))

with urllib.request.urlopen(f"http://{a.upstream}/__upstream/requests") as f:
    seen = json.load(f)["requests"]
r["upstream_requests"] = len(seen)
if a.upstream_cpu_us is not None:
    r["upstream_cpu_us"] = a.upstream_cpu_us
if a.gateway_cpu_us is not None:
    r["gateway_cpu_us"] = a.gateway_cpu_us
with urllib.request.urlopen(f"http://{a.upstream}/__upstream/grants") as f:
    rejected = json.load(f)["rejected"]
problems = []
if rejected:
    problems.append(f"the upstream answered {rejected} requests 403: bad signature")
if r["errors"]:
    problems.append(f"{r['errors']} transport errors")
if a.expect == "refused":
    if seen:
        problems.append(f"{len(seen)} requests reached the upstream")
    if a.wrk and w["status_errors"] != w["requests"]:
        problems.append(f"{w['requests'] - w['status_errors']} of {w['requests']} answers were 2xx")
    if a.code:
        wrong = {k: v for k, v in r.get("outcomes", {}).items() if k != a.code}
        if wrong:
            problems.append(f"answers other than {a.code}: {wrong}")
else:
    if a.wrk:
        if w["status_errors"]:
            problems.append(f"{w['status_errors']} non-2xx answers")
        if not ok2xx <= len(seen) <= ok2xx + a.connections:
            problems.append(f"{ok2xx} winners answered but the upstream saw {len(seen)}")
    elif ok2xx != len(seen):
        problems.append(f"{ok2xx} winners answered but the upstream saw {len(seen)}")
if a.exact_winners is not None and len(seen) != a.exact_winners:
    problems.append(f"{len(seen)} winners reached the upstream, expected exactly {a.exact_winners}")
if a.peer_secret is not None:
    users = set()
    for q in seen:
        h = q["headers"]
        grant = h.get("x-seckill-grant", "")
        msg, _, sig = grant.rpartition(":")
        _act, _, rest = msg.partition(":")
        user = rest.rsplit(":", 2)[0] if rest.count(":") >= 2 else None
        mac = base64.b64encode(hmac.new(a.peer_secret.encode(), msg.encode(), hashlib.sha256).digest())
        if not grant or not hmac.compare_digest(mac.decode(), sig):
            problems.append(f"a bad grant reached the upstream: {grant!r}")
            break
        if user != h.get("x-user-id"):
            problems.append(f"a grant for {user!r} came with buyer {h.get('x-user-id')!r}")
            break
        if user in users:
            problems.append(f"buyer {user} reached the upstream twice")
            break
        users.add(user)
    for what, n in (("Redis users-set growth", a.peer_users), ("stock taken", a.peer_sold)):
        if n is not None and n != len(seen):
            problems.append(f"{what} {n} != {len(seen)} upstream requests")
    check.append(f"peer: {len(users)} signed grants, one per buyer")
check.append(f"upstream saw {len(seen)}")
r["correct"] = not problems
r["check"] = check + problems
json.dump(r, open(a.out, "w"))
if problems:
    print(f"bench: {a.out}: " + "; ".join(problems), file=sys.stderr)
