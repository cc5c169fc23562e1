// MQTT.js (npm `mqtt` 5.x) as a Postbox client, driven by tests/suite/interop.rs.
//
// Used the way its README shows: mqtt.connect(url, options), then subscribe() and publish()
// at once (MQTT.js queues them until CONNACK and sends them itself), 'message' events for what
// arrives, end() to finish. Its own reconnect and session handling are left at their defaults.
//
// One argument: a JSON object {scenario, url, id, v5, ca}. Output: one JSON object per line
// (event: connack, subscribed, message, published, end, ends, error); exit 0 when every wait
// of the scenario was met, 1 otherwise. Every wait is bounded (WAIT ms).
'use strict';

const fs = require('fs');
const { spawn } = require('child_process');
const mqtt = require('mqtt');

const WAIT = 10000;
const CFG = JSON.parse(process.argv[2]);
const ID = CFG.id;

function out(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function fail(what) {
  out({ event: 'error', what });
  process.exit(1);
}

// Anything thrown or emitted as an error anywhere (e.g. `write EPIPE`) is reported and fails.
const errors = [];
process.on('uncaughtException', (e) => {
  errors.push(String(e));
  out({ event: 'error', what: 'uncaught', error: String(e) });
});

function options(extra) {
  const o = { clientId: extra.clientId, protocolVersion: CFG.v5 ? 5 : 4, ...extra };
  if (CFG.ca) {
    o.ca = fs.readFileSync(CFG.ca);
    o.rejectUnauthorized = true;
  }
  return o;
}

function propsOf(packet) {
  const p = packet.properties || {};
  const got = {};
  if (p.userProperties) {
    // As (key, value) pairs in order, the way the wire has them.
    got.user = Object.entries(p.userProperties)
      .flatMap(([k, v]) => (Array.isArray(v) ? v : [v]).map((x) => [k, x]));
  }
  if (p.messageExpiryInterval !== undefined) got.expiry = p.messageExpiryInterval;
  if (p.responseTopic) got.response_topic = p.responseTopic;
  if (p.correlationData) got.correlation = p.correlationData.toString();
  return got;
}

// A client with a log of what arrived and a bounded wait for the n-th message.
function client(clientId, extra = {}) {
  const c = mqtt.connect(CFG.url, options({ clientId, ...extra }));
  c.received = [];
  c.waiters = [];
  c.on('connect', (connack) => {
    out({ event: 'connack', rc: connack.returnCode ?? connack.reasonCode ?? 0,
      session_present: !!connack.sessionPresent, client: clientId });
  });
  c.on('error', (e) => {
    errors.push(String(e));
    out({ event: 'error', what: 'client error', client: clientId, error: String(e) });
  });
  c.on('message', (topic, payload, packet) => {
    const seen = { topic, payload: payload.toString(), qos: packet.qos, retain: !!packet.retain,
      props: propsOf(packet) };
    out({ event: 'message', ...seen });
    if (c.onMessageHook) c.onMessageHook(topic, payload, packet);
    c.received.push(seen);
    c.waiters = c.waiters.filter((w) => !w());
  });
  c.messages = (n, what) => new Promise((resolve) => {
    const timer = setTimeout(() => fail(`${what}: ${c.received.length} of ${n} messages`), WAIT);
    const check = () => {
      if (c.received.length >= n) { clearTimeout(timer); resolve(); return true; }
      return false;
    };
    if (!check()) c.waiters.push(check);
  });
  return c;
}

function bounded(promise, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what)), WAIT); }),
  ]).finally(() => clearTimeout(timer)).catch((e) => fail(String(e.message || e)));
}

async function end(c) {
  await bounded(c.endAsync(), 'end() completes');
  out({ event: 'end', errors: errors.length });
}

async function basic() {
  const c = client(`${ID}-basic`);
  // At once, without waiting for 'connect'; the publishes in the subscribe callback, as the
  // README does. (Published at once too, the QoS 1/2 ones would miss the subscription:
  // MQTT.js sends its stored QoS > 0 publishes before the queued SUBSCRIBE on connect.)
  await bounded(c.subscribeAsync([`t/${ID}/#`, `resp/${ID}`], { qos: 2 }), 'SUBACK');
  for (const qos of [0, 1, 2]) c.publish(`t/${ID}/q${qos}`, `q${qos}`, { qos });
  await c.messages(3, 'QoS 0/1/2 round trips');
  let n = 3;
  if (CFG.v5) {
    c.onMessageHook = (topic, payload, packet) => {
      const p = packet.properties || {};
      if (topic === `t/${ID}/props` && p.responseTopic) {
        c.publish(p.responseTopic, 'reply', { qos: 1, properties: { correlationData: p.correlationData } });
      }
    };
    c.publish(`t/${ID}/props`, 'with-props', {
      qos: 1,
      properties: {
        userProperties: { k: ['v', 'w'] },
        messageExpiryInterval: 60,
        responseTopic: `resp/${ID}`,
        correlationData: Buffer.from('corr-1'),
      },
    });
    n += 2;
    await c.messages(n, 'v5 properties and the response-topic reply');
  }
  await bounded(c.publishAsync(`r/${ID}`, 'retained', { qos: 1, retain: true }), 'retained PUBACK');
  c.subscribe(`r/${ID}`, { qos: 1 });
  await c.messages(n + 1, 'retained message on a later subscription');
  await end(c);
}

async function will() {
  const watcher = client(`${ID}-watch`);
  const granted = await bounded(watcher.subscribeAsync(`w/${ID}/#`, { qos: 1 }), 'SUBACK');
  out({ event: 'subscribed', codes: granted.map((g) => g.qos) });
  const clean = client(`${ID}-clean`, { will: { topic: `w/${ID}/clean`, payload: 'clean-will', qos: 1 } });
  await bounded(new Promise((r) => clean.once('connect', r)), 'clean will client connects');
  await end(clean);
  const child = spawn(process.execPath, [__filename, JSON.stringify({ ...CFG, scenario: 'will-child' })],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  await bounded(new Promise((resolve) => {
    let text = '';
    child.stdout.on('data', (d) => { text += d; if (text.includes('"connack"')) resolve(); });
  }), 'will child connects');
  child.kill('SIGKILL'); // the socket closes without DISCONNECT
  await watcher.messages(1, 'the will of the killed client');
  // A fence: the watcher's own message comes after anything still in flight to it.
  watcher.publish(`w/${ID}/fence`, 'fence', { qos: 1 });
  await watcher.messages(2, 'fence');
  await end(watcher);
}

async function willChild() {
  const c = client(`${ID}-unclean`, { will: { topic: `w/${ID}/unclean`, payload: 'unclean-will', qos: 1 } });
  await bounded(new Promise((r) => c.once('connect', r)), 'connects');
  setTimeout(() => process.exit(1), WAIT * 3); // until killed (bounded)
}

const SESSION = { clean: false, properties: CFG.v5 ? { sessionExpiryInterval: 3600 } : undefined };

async function sessionSub() {
  const c = client(`${ID}-sess`, SESSION);
  const granted = await bounded(c.subscribeAsync(`s/${ID}`, { qos: 1 }), 'SUBACK');
  out({ event: 'subscribed', codes: granted.map((g) => g.qos) });
  await end(c);
}

async function sessionPub() {
  const c = client(`${ID}-pub`);
  await bounded(Promise.all([1, 2, 3].map((i) => c.publishAsync(`s/${ID}`, `m${i}`, { qos: 1 }))), 'PUBACKs');
  out({ event: 'published', n: 3 });
  await end(c);
}

async function sessionResume() {
  const c = client(`${ID}-sess`, SESSION);
  await c.messages(3, 'queued QoS 1 messages after the restart');
  await end(c);
}

// The finding of issue 34: clean end()s, each after a QoS 1 publish, N times in a row;
// no 'error' event (e.g. `write EPIPE`) may come of any of them.
async function ends() {
  const n = CFG.n || 20;
  for (let i = 0; i < n; i++) {
    const c = client(`${ID}-end${i}`);
    await bounded(c.publishAsync(`e/${ID}`, `e${i}`, { qos: 1 }), 'PUBACK');
    await bounded(c.endAsync(), 'end() completes');
  }
  // Errors of a closing stream may be emitted a little after end() completes: let the event
  // loop drain what is already due (one macrotask turn, no sleep on a guess).
  await new Promise((r) => setImmediate(r));
  out({ event: 'ends', n, errors });
}

const SCENARIOS = {
  basic, will, 'will-child': willChild, 'session-sub': sessionSub, 'session-pub': sessionPub,
  'session-resume': sessionResume, ends,
};

SCENARIOS[CFG.scenario]().then(() => {
  if (CFG.scenario !== 'will-child') process.exit(errors.length ? 1 : 0);
}, (e) => fail(String(e)));
