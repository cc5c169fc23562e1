"""paho-mqtt (2.x) as a Postbox client, driven by tests/suite/interop.rs.

Used the way paho's README shows: connect(), loop_start(), then subscribe and publish at once
(the packets go out right behind CONNECT, before CONNACK), callbacks for what arrives, and
disconnect() + loop_stop() to end. Both callback API versions are exercised (`api`: 1 or 2).

One argument: a JSON object {"scenario", "host", "port", "id", "api", "v5"}. Output: one JSON
object per line ("event": connack, subscribed, message, published, end, error); exit 0 when
the scenario's waits were all met, 1 otherwise. Every wait is bounded (WAIT seconds).
"""

import json
import subprocess
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

WAIT = 10.0
CFG = json.loads(sys.argv[1])
V5 = bool(CFG.get("v5"))
API = mqtt.CallbackAPIVersion.VERSION2 if CFG.get("api") == 2 else mqtt.CallbackAPIVersion.VERSION1
ID = CFG["id"]
LOCK = threading.Lock()


def out(**event):
    with LOCK:
        print(json.dumps(event), flush=True)


def fail(what):
    out(event="error", what=what)
    sys.exit(1)


def props_of(msg):
    """The v5 properties of a received message, as JSON-able values."""
    p = getattr(msg, "properties", None)
    if p is None:
        return {}
    got = {}
    if hasattr(p, "UserProperty"):
        got["user"] = [list(kv) for kv in p.UserProperty]
    if hasattr(p, "MessageExpiryInterval"):
        got["expiry"] = p.MessageExpiryInterval
    if hasattr(p, "ResponseTopic"):
        got["response_topic"] = p.ResponseTopic
    if hasattr(p, "CorrelationData"):
        got["correlation"] = p.CorrelationData.decode()
    return got


class Client:
    """One paho client with events for what the scenario awaits."""

    def __init__(self, client_id, clean=True, will=None):
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.ended = threading.Event()
        self.messages = []
        self.arrived = threading.Condition()
        self.on_message_hook = None
        kwargs = {"client_id": client_id}
        if V5:
            kwargs["protocol"] = mqtt.MQTTv5
        else:
            kwargs["protocol"] = mqtt.MQTTv311
            kwargs["clean_session"] = clean
        self.clean = clean
        self.c = mqtt.Client(API, **kwargs)
        if will:
            self.c.will_set(will[0], will[1], qos=1)
        if API == mqtt.CallbackAPIVersion.VERSION2:
            self.c.on_connect = self.on_connect_v2
            self.c.on_subscribe = self.on_subscribe_v2
            self.c.on_disconnect = self.on_disconnect_v2
        else:
            self.c.on_connect = self.on_connect_v1
            self.c.on_subscribe = self.on_subscribe_v1
            self.c.on_disconnect = self.on_disconnect_v1
        self.c.on_message = self.on_message

    # VERSION2 callbacks: flags object, ReasonCode, properties always passed.
    def on_connect_v2(self, client, userdata, flags, reason_code, properties):
        out(event="connack", rc=reason_code.value, session_present=bool(flags.session_present),
            client=client._client_id.decode())
        self.connected.set()

    def on_subscribe_v2(self, client, userdata, mid, reason_codes, properties):
        out(event="subscribed", codes=[rc.value for rc in reason_codes])
        self.subscribed.set()

    def on_disconnect_v2(self, client, userdata, flags, reason_code, properties):
        self.end_rc = reason_code.value
        self.ended.set()

    # VERSION1 callbacks: a dict of flags, an int (3.1.1) or ReasonCode (5), properties on v5.
    def on_connect_v1(self, client, userdata, flags, rc, properties=None):
        rc = rc if isinstance(rc, int) else rc.value
        out(event="connack", rc=rc, session_present=bool(flags["session present"]),
            client=client._client_id.decode())
        self.connected.set()

    def on_subscribe_v1(self, client, userdata, mid, granted, properties=None):
        codes = [g if isinstance(g, int) else g.value for g in granted]
        out(event="subscribed", codes=codes)
        self.subscribed.set()

    def on_disconnect_v1(self, client, userdata, rc, properties=None):
        self.end_rc = rc if isinstance(rc, int) else rc.value
        self.ended.set()

    def on_message(self, client, userdata, msg):
        seen = {"topic": msg.topic, "payload": msg.payload.decode(), "qos": msg.qos,
                "retain": bool(msg.retain), "props": props_of(msg)}
        out(event="message", **seen)
        if self.on_message_hook:
            self.on_message_hook(msg)
        with self.arrived:
            self.messages.append(seen)
            self.arrived.notify_all()

    def connect(self, session_expiry=None):
        if V5:
            props = None
            if session_expiry is not None:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = session_expiry
            self.c.connect(CFG["host"], CFG["port"], keepalive=30, clean_start=self.clean,
                           properties=props)
        else:
            self.c.connect(CFG["host"], CFG["port"], keepalive=30)
        self.c.loop_start()

    def wait_messages(self, n, what):
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.messages) >= n, WAIT):
                fail(f"{what}: {len(self.messages)} of {n} messages")

    def wait(self, event, what):
        if not event.wait(WAIT):
            fail(what)

    def end(self):
        self.c.disconnect()
        self.wait(self.ended, "disconnect completes")
        self.c.loop_stop()
        out(event="end", rc=self.end_rc)


def basic():
    """Pipelined subscribe + QoS 0/1/2 publishes, a retained message, v5 properties."""
    cl = Client(f"{ID}-basic")
    cl.connect()
    # At once, without waiting for CONNACK: these go out right behind CONNECT.
    cl.c.subscribe([(f"t/{ID}/#", 2), (f"resp/{ID}", 2)])
    for q in (0, 1, 2):
        cl.c.publish(f"t/{ID}/q{q}", f"q{q}", qos=q)
    cl.wait_messages(3, "QoS 0/1/2 round trips")
    n = 3
    if V5:
        def responder(msg):
            p = getattr(msg, "properties", None)
            if msg.topic == f"t/{ID}/props" and p is not None and hasattr(p, "ResponseTopic"):
                reply = Properties(PacketTypes.PUBLISH)
                reply.CorrelationData = p.CorrelationData
                cl.c.publish(p.ResponseTopic, "reply", qos=1, properties=reply)
        cl.on_message_hook = responder
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("k", "v"), ("k", "w")]
        props.MessageExpiryInterval = 60
        props.ResponseTopic = f"resp/{ID}"
        props.CorrelationData = b"corr-1"
        cl.c.publish(f"t/{ID}/props", "with-props", qos=1, properties=props)
        n += 2  # the message and the reply on its response topic
        cl.wait_messages(n, "v5 properties and the response-topic reply")
    info = cl.c.publish(f"r/{ID}", "retained", qos=1, retain=True)
    info.wait_for_publish(WAIT)
    cl.c.subscribe(f"r/{ID}", 1)
    cl.wait_messages(n + 1, "retained message on a later subscription")
    cl.end()


def will():
    """A will is published on an unclean close (a killed process) and not on a clean one."""
    watcher = Client(f"{ID}-watch")
    watcher.connect()
    watcher.c.subscribe(f"w/{ID}/#", 1)
    watcher.wait(watcher.subscribed, "SUBACK")
    clean = Client(f"{ID}-clean", will=(f"w/{ID}/clean", "clean-will"))
    clean.connect()
    clean.wait(clean.connected, "clean will client connects")
    clean.end()
    child_cfg = dict(CFG, scenario="will-child")
    child = subprocess.Popen([sys.executable, __file__, json.dumps(child_cfg)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if '"connack"' not in line:
            fail(f"will child did not connect: {line!r}")
        child.kill()  # SIGKILL: the socket closes without DISCONNECT
        child.wait(WAIT)
    finally:
        if child.poll() is None:
            child.kill()
    watcher.wait_messages(1, "the will of the killed client")
    # A fence: the watcher's own message comes after anything still in flight to it.
    watcher.c.publish(f"w/{ID}/fence", "fence", qos=1)
    watcher.wait_messages(2, "fence")
    watcher.end()


def will_child():
    cl = Client(f"{ID}-unclean", will=(f"w/{ID}/unclean", "unclean-will"))
    cl.connect()
    cl.wait(cl.connected, "connects")
    threading.Event().wait(WAIT * 3)  # until killed (bounded)


def session_sub():
    cl = Client(f"{ID}-sess", clean=False)
    cl.connect(session_expiry=3600)
    cl.c.subscribe(f"s/{ID}", 1)
    cl.wait(cl.subscribed, "SUBACK")
    cl.end()


def session_pub():
    cl = Client(f"{ID}-pub")
    cl.connect()
    infos = [cl.c.publish(f"s/{ID}", f"m{i}", qos=1) for i in (1, 2, 3)]
    for info in infos:
        info.wait_for_publish(WAIT)
        if not info.is_published():
            fail("PUBACK")
    out(event="published", n=len(infos))
    cl.end()


def session_resume():
    cl = Client(f"{ID}-sess", clean=False)
    cl.connect(session_expiry=3600)
    cl.wait_messages(3, "queued QoS 1 messages after the restart")
    cl.end()


SCENARIOS = {"basic": basic, "will": will, "will-child": will_child,
             "session-sub": session_sub, "session-pub": session_pub,
             "session-resume": session_resume}

if __name__ == "__main__":
    SCENARIOS[CFG["scenario"]]()
