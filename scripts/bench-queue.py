#!/usr/bin/env python3
"""Waiting-room rows of scripts/bench (Q2, Q3): Redis script calls per ticket and per admitted
purchase, through a gateway whose only Redis traffic is its queues' refresh (counted and taken
off). Prints one JSON object.

usage: bench-queue.py <gateway host:port> <redis port> <activity> <buyers> <queues>
"""
import http.client, json, subprocess, sys, time

gw, redis_port, activity, buyers, queues = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
host, port = gw.split(":")

def script_calls():
    info = subprocess.run(["redis-cli", "-p", redis_port, "INFO", "commandstats"],
                          capture_output=True, text=True, check=True).stdout
    calls = 0
    for line in info.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls

conn = http.client.HTTPConnection(host, int(port), timeout=10)
def buy(user, ticket=None):
    headers = {"X-User-Id": user, "Content-Length": "0"}
    if ticket:
        headers["X-Flashgate-Ticket"] = ticket
    conn.request("POST", f"/api/seckill/{activity}/buy", headers=headers)
    r = conn.getresponse()
    body = r.read()
    return r.status, body

REFRESH_PER_SEC = 4  # src/waiting/mod.rs REFRESH_INTERVAL (250 ms), per queue
def measured(step):
    subprocess.run(["redis-cli", "-p", redis_port, "CONFIG", "RESETSTAT"], capture_output=True, check=True)
    start = time.monotonic()
    step()
    elapsed = time.monotonic() - start
    calls = script_calls()
    background = elapsed * REFRESH_PER_SEC * queues
    return calls, background

tickets = {}
def issue():
    for i in range(buyers):
        status, body = buy(f"qb{i}")
        assert status == 202, (status, body)
        tickets[f"qb{i}"] = json.loads(body)["ticket"]
def admit():
    for user, ticket in tickets.items():
        status, body = buy(user, ticket)
        assert status == 200, (status, body)

t_calls, t_bg = measured(issue)
time.sleep(0.5)  # every ticket's turn (the rate is far above the buyers)
a_calls, a_bg = measured(admit)
print(json.dumps({
    "buyers": buyers,
    "ticket_calls": t_calls, "ticket_background": round(t_bg, 1),
    "per_ticket": round(max(t_calls - t_bg, 0) / buyers, 3),
    "admission_calls": a_calls, "admission_background": round(a_bg, 1),
    "per_admission": round(max(a_calls - a_bg, 0) / buyers, 3),
}))
