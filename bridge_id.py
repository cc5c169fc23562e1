# Can a client take the bridge's local session ($bridge/cloud) or its remote client id? Ports 2640x.
import sys, time, socket
sys.path.insert(0, '/tmp/pass14')
import wslib; wslib.TCP = 26401; wslib.METRICS = 26409
from wslib import *
for name, kw in [('anonymous', {}), ('sensor1', {'user': 'sensor1'}), ('anonymous v3.1.1', {'v': 4}), ('anonymous clean=0', {'clean': False, 'expiry': 600})]:
    for cid in ['$bridge/cloud', '$bridge/Cloud', '$bridge/cloud ', 'postbox-bridge-cloud']:
        try:
            sk, r = cli(cid, **kw); got = pub_topics(read_packets(sk, 0.3))
            print(f'{name:20s} client id {cid!r:26s} CONNACK {r[:5].hex()} got {got}')
            sk.close()
        except Exception as e: print(name, cid, 'error', e)
time.sleep(1)
mm = m('bridge_connected|bridge_up|bridge_state|bridge_forwarded')
print({k: v for k, v in mm.items() if 'HELP' not in k})
