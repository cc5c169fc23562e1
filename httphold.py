# Idle / half-sent HTTP requests on the metrics+admin port: how long does the broker keep them?
import socket, sys, time
port=int(sys.argv[1]); n=int(sys.argv[2]); wait=float(sys.argv[3]); mode=sys.argv[4] if len(sys.argv)>4 else "partial"
socks=[]
for i in range(n):
    s=socket.create_connection(("127.0.0.1",port),timeout=3)
    if mode=="partial": s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    socks.append(s)
t0=time.time()
def alive():
    a=0
    for s in socks:
        s.setblocking(False)
        try:
            d=s.recv(100)
            if d: a+=1
        except BlockingIOError: a+=1
        except Exception: pass
    return a
time.sleep(wait)
print(f"mode={mode}: {n} opened, {alive()} still open after {time.time()-t0:.0f}s")
for s in socks: s.close()
