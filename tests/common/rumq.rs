//! rumqttc v4 (3.1.1) and v5 clients driven by a background event loop, with bounded waits.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::WAIT;

/// One poll of a rumqttc event loop (the v4 and v5 APIs have separate types, with the same
/// shape): the incoming packet, `None` for any other event, `Err` when the connection ended.
trait Incoming: Send + 'static {
    type Packet: Send + 'static;
    fn incoming(&mut self) -> impl Future<Output = Result<Option<Self::Packet>, ()>> + Send;
}

impl Incoming for rumqttc::EventLoop {
    type Packet = rumqttc::Packet;
    async fn incoming(&mut self) -> Result<Option<rumqttc::Packet>, ()> {
        match self.poll().await {
            Ok(rumqttc::Event::Incoming(p)) => Ok(Some(p)),
            Ok(_) => Ok(None),
            Err(_) => Err(()),
        }
    }
}

impl Incoming for rumqttc::v5::EventLoop {
    type Packet = P5;
    async fn incoming(&mut self) -> Result<Option<P5>, ()> {
        match self.poll().await {
            Ok(rumqttc::v5::Event::Incoming(p)) => Ok(Some(p)),
            Ok(_) => Ok(None),
            Err(_) => Err(()),
        }
    }
}

/// Drives `eventloop` in a task that forwards every incoming packet, then `None` once the
/// connection ends (and stops when the receiver is gone): the one event pump of [`V4`] and
/// [`V5`].
fn pump<L: Incoming>(
    mut eventloop: L,
) -> (mpsc::UnboundedReceiver<Option<L::Packet>>, JoinHandle<()>) {
    let (tx, events) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.incoming().await {
                Ok(Some(p)) => {
                    if tx.send(Some(p)).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(()) => {
                    let _ = tx.send(None);
                    return;
                }
            }
        }
    });
    (events, task)
}

/// The next packet from a client's event pump (`None`: the connection ended); panics after
/// `WAIT`.
async fn next_incoming<P>(events: &mut mpsc::UnboundedReceiver<Option<P>>) -> Option<P> {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("timed out waiting for an event")
        .flatten()
}

/// The first of the next packets that `pick` takes, the others skipped: every wait for an
/// answer (SUBACK, an acknowledgement, a PUBLISH) of [`V4`] and [`V5`]. Panics if the
/// connection ends first (naming `what`, the awaited packet) or a packet takes over `WAIT`.
async fn next_picked<P, T>(
    events: &mut mpsc::UnboundedReceiver<Option<P>>,
    what: &str,
    pick: impl Fn(P) -> Option<T>,
) -> T {
    loop {
        match next_incoming(events).await {
            Some(p) => {
                if let Some(picked) = pick(p) {
                    return picked;
                }
            }
            None => panic!("connection ended while waiting for {what}"),
        }
    }
}

/// A 3.1.1 client (rumqttc v4 API).
pub struct V4 {
    pub client: rumqttc::AsyncClient,
    events: mpsc::UnboundedReceiver<Option<rumqttc::Packet>>,
    task: JoinHandle<()>,
    pub session_present: bool,
}

impl V4 {
    /// Connects and waits for CONNACK.
    pub async fn connect(addr: SocketAddr, id: &str, clean: bool) -> V4 {
        let mut options = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
        options.set_clean_session(clean);
        options.set_keep_alive(Duration::from_secs(30));
        V4::connect_with(options).await
    }

    /// Connects with custom options and waits for CONNACK.
    pub async fn connect_with(options: rumqttc::MqttOptions) -> V4 {
        let (client, eventloop) = rumqttc::AsyncClient::new(options, 1000);
        let (events, task) = pump(eventloop);
        let mut c = V4 {
            client,
            events,
            task,
            session_present: false,
        };
        match c.next_event().await {
            Some(rumqttc::Packet::ConnAck(ack)) => {
                assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
                c.session_present = ack.session_present;
            }
            other => panic!("expected CONNACK, got {other:?}"),
        }
        c
    }

    /// Next incoming packet (None: connection ended). Panics after `WAIT`.
    pub async fn next_event(&mut self) -> Option<rumqttc::Packet> {
        next_incoming(&mut self.events).await
    }

    /// Subscribes and waits for SUBACK; returns its return codes.
    pub async fn subscribe(
        &mut self,
        filter: &str,
        qos: rumqttc::QoS,
    ) -> Vec<rumqttc::SubscribeReasonCode> {
        self.client
            .subscribe(filter, qos)
            .await
            .expect("subscribe queued");
        next_picked(&mut self.events, "SUBACK", |p| match p {
            rumqttc::Packet::SubAck(ack) => Some(ack.return_codes),
            _ => None,
        })
        .await
    }

    /// Publishes; for QoS 1/2 waits for the broker's PUBACK / PUBCOMP.
    pub async fn publish(&mut self, topic: &str, qos: rumqttc::QoS, retain: bool, payload: &[u8]) {
        self.client
            .publish(topic, qos, retain, payload.to_vec())
            .await
            .expect("publish queued");
        let done = |p: &rumqttc::Packet| match qos {
            rumqttc::QoS::AtMostOnce => true,
            rumqttc::QoS::AtLeastOnce => matches!(p, rumqttc::Packet::PubAck(_)),
            rumqttc::QoS::ExactlyOnce => matches!(p, rumqttc::Packet::PubComp(_)),
        };
        if qos == rumqttc::QoS::AtMostOnce {
            return;
        }
        next_picked(&mut self.events, "the publish's acknowledgement", |p| {
            done(&p).then_some(())
        })
        .await;
    }

    /// Next PUBLISH, skipping other packets.
    pub async fn next_publish(&mut self) -> rumqttc::Publish {
        next_picked(&mut self.events, "a PUBLISH", |p| match p {
            rumqttc::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }

    /// Sends DISCONNECT and waits for the event loop to end.
    pub async fn disconnect(mut self) {
        let _ = self.client.disconnect().await;
        let _ = tokio::time::timeout(WAIT, async {
            while let Some(Some(_)) = self.events.recv().await {}
        })
        .await;
        self.task.abort();
    }

    /// Drops the connection without DISCONNECT (abnormal close).
    pub fn kill(self) {
        self.task.abort();
    }
}

/// A 5.0 client (rumqttc v5 API).
pub struct V5 {
    pub client: rumqttc::v5::AsyncClient,
    events: mpsc::UnboundedReceiver<Option<rumqttc::v5::mqttbytes::v5::Packet>>,
    task: JoinHandle<()>,
    pub connack: rumqttc::v5::mqttbytes::v5::ConnAck,
}

/// The v5 packet type.
pub use rumqttc::v5::mqttbytes::v5::Packet as P5;

impl V5 {
    /// Connects (clean start, no expiry) and waits for CONNACK.
    pub async fn connect(addr: SocketAddr, id: &str) -> V5 {
        let mut options = rumqttc::v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
        options.set_keep_alive(Duration::from_secs(30));
        V5::connect_with(options).await
    }

    /// Connects with custom options and waits for CONNACK.
    pub async fn connect_with(options: rumqttc::v5::MqttOptions) -> V5 {
        let (client, eventloop) = rumqttc::v5::AsyncClient::new(options, 1000);
        let (mut events, task) = pump(eventloop);
        let connack = match tokio::time::timeout(WAIT, events.recv()).await {
            Ok(Some(Some(P5::ConnAck(ack)))) => ack,
            other => panic!("expected CONNACK, got {other:?}"),
        };
        V5 {
            client,
            events,
            task,
            connack,
        }
    }

    /// Next incoming packet (None: connection ended). Panics after `WAIT`.
    pub async fn next_event(&mut self) -> Option<P5> {
        next_incoming(&mut self.events).await
    }

    /// Next PUBLISH, skipping other packets.
    pub async fn next_publish(&mut self) -> rumqttc::v5::mqttbytes::v5::Publish {
        next_picked(&mut self.events, "a PUBLISH", |p| match p {
            P5::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }

    /// Subscribes to `filter` at `qos` and waits for the SUBACK ([`Self::suback`]).
    pub async fn subscribe(
        &mut self,
        filter: impl Into<String>,
        qos: rumqttc::v5::mqttbytes::QoS,
    ) -> rumqttc::v5::mqttbytes::v5::SubAck {
        self.client
            .subscribe(filter, qos)
            .await
            .expect("subscribe queued");
        self.suback().await
    }

    /// Waits for the next SUBACK.
    pub async fn suback(&mut self) -> rumqttc::v5::mqttbytes::v5::SubAck {
        next_picked(&mut self.events, "SUBACK", |p| match p {
            P5::SubAck(ack) => Some(ack),
            _ => None,
        })
        .await
    }

    /// Drops the connection without DISCONNECT.
    pub fn kill(self) {
        self.task.abort();
    }
}
