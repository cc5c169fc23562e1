#!/usr/bin/env python3
"""Reconnect storm: N clients (user{i}/pw{i}) CONNECT (3.1.1) with passwords, at most C in
flight; prints the time until all have a CONNACK 0, then closes them all. Run twice in a row
for cold and warm (cached) rounds."""
import asyncio, sys, time, struct

def s(b): return struct.pack(">H", len(b)) + b

def connect_packet(i):
    cid, user, pw = f"storm{i}".encode(), f"user{i}".encode(), f"pw{i}".encode()
    var = s(b"MQTT") + bytes([4, 0xC2]) + struct.pack(">H", 600)
    body = var + s(cid) + s(user) + s(pw)
    n = len(body); rl = bytearray()
    while True:
        b = n % 128; n //= 128
        rl.append(b | (0x80 if n else 0))
        if not n: break
    return bytes([0x10]) + bytes(rl) + body

async def one(port, i, sem, held, fails):
    async with sem:
        for attempt in range(50):
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(connect_packet(i)); await w.drain()
                ack = await asyncio.wait_for(r.readexactly(4), 60)
                if ack[3] == 0:
                    held.append(w); return
                fails[ack[3]] = fails.get(ack[3], 0) + 1
                w.close(); return
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                fails["retry"] = fails.get("retry", 0) + 1
                await asyncio.sleep(0.05)

async def main(port, n, c, rounds):
    for rnd in range(rounds):
        sem = asyncio.Semaphore(c); held = []; fails = {}
        t = time.monotonic()
        await asyncio.gather(*(one(port, i, sem, held, fails) for i in range(n)))
        dt = time.monotonic() - t
        print(f"round {rnd+1}: {len(held)}/{n} connected in {dt:.2f} s ({len(held)/dt:.0f}/s) failures={fails}", flush=True)
        for w in held: w.close()
        await asyncio.sleep(0.5)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
