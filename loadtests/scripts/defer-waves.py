"""When do deferred idle connections reach accept()? (hostile report, stop 27)

Usage: python3 loadtests/scripts/defer-waves.py SECONDS [CONNECTIONS]
(loopback only; needs an open-file limit above CONNECTIONS * 2).

 A listener with
TCP_DEFER_ACCEPT = D seconds; N client connections opened evenly over
SPREAD seconds, sending nothing; the listener records when each is
accepted. Prints how many accepts share each tick (gaps > 5 ms split
bursts), and the spacing between bursts."""
import socket, sys, time, threading, select
D = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 1500; SPREAD = 3.0
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(4096)
srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, D)
addr = srv.getsockname()
times = []; held = []
def acceptor():
    srv.settimeout(0.5)
    deadline = time.monotonic() + SPREAD + D + 12
    while time.monotonic() < deadline and len(times) < N:
        try:
            c, _ = srv.accept()
        except socket.timeout:
            continue
        times.append(time.monotonic()); held.append(c)
t = threading.Thread(target=acceptor); t.start()
clients = []
t0 = time.monotonic()
for i in range(N):
    while time.monotonic() < t0 + SPREAD * i / N:
        time.sleep(0.0005)
    s = socket.socket(); s.connect(addr); clients.append(s)
t.join()
times.sort()
bursts = []; start = times[0]; n = 1; last = times[0]
for x in times[1:]:
    if x - last > 0.005:
        bursts.append((start, n)); start = x; n = 0
    n += 1; last = x
bursts.append((start, n))
gaps = [round((b[0] - a[0]) * 1000) for a, b in zip(bursts, bursts[1:])]
sizes = [b[1] for b in bursts]
print(f"defer_accept={D}s: {len(times)} of {N} accepted, first {times[0]-t0:.2f} s after the first connect; {len(bursts)} bursts, sizes {sorted(sizes)[len(sizes)//2]} median / {max(sizes)} max; ms between bursts (median {sorted(gaps)[len(gaps)//2] if gaps else '-'}): {gaps[:12]}")
