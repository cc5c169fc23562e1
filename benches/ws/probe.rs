// Throughput probe: QoS 0 p2p through a broker over plain TCP or WebSocket (same client code).
use futures_util::{SinkExt, StreamExt};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

enum Conn {
    Tcp(TcpStream),
    Ws(tokio_tungstenite::WebSocketStream<TcpStream>),
}

impl Conn {
    async fn open(ws: bool, addr: &str) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        if !ws {
            return Conn::Tcp(s);
        }
        let mut req = format!("ws://{addr}/mqtt").into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
        let (w, _) = tokio_tungstenite::client_async(req, s).await.unwrap();
        Conn::Ws(w)
    }
    async fn send(&mut self, b: Vec<u8>) {
        match self {
            Conn::Tcp(s) => s.write_all(&b).await.unwrap(),
            Conn::Ws(w) => w.send(Message::Binary(b.into())).await.unwrap(),
        }
    }
    async fn recv(&mut self, out: &mut Vec<u8>) -> bool {
        match self {
            Conn::Tcp(s) => {
                let mut buf = [0u8; 65536];
                let n = s.read(&mut buf).await.unwrap();
                out.extend_from_slice(&buf[..n]);
                n > 0
            }
            Conn::Ws(w) => loop {
                match w.next().await {
                    Some(Ok(Message::Binary(b))) => { out.extend_from_slice(&b); return true; }
                    Some(Ok(_)) => continue,
                    _ => return false,
                }
            },
        }
    }
}

fn connect(id: &str) -> Vec<u8> {
    let mut v = vec![0x10, 0];
    v.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, id.len() as u8]);
    v.extend_from_slice(id.as_bytes());
    v[1] = (v.len() - 2) as u8;
    v
}

fn varint(mut n: usize, v: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 { b |= 0x80; }
        v.push(b);
        if n == 0 { break; }
    }
}

/// Counts complete packets in `buf`, drains them; returns PUBLISH count.
fn count(buf: &mut Vec<u8>) -> usize {
    let (mut i, mut pubs) = (0, 0);
    loop {
        if buf.len() < i + 2 { break; }
        let (mut len, mut mul, mut j) = (0usize, 1usize, i + 1);
        let mut ok = false;
        while j < buf.len() && j < i + 5 {
            len += (buf[j] & 0x7F) as usize * mul;
            mul *= 128;
            j += 1;
            if buf[j - 1] & 0x80 == 0 { ok = true; break; }
        }
        if !ok || buf.len() < j + len { break; }
        if buf[i] >> 4 == 3 { pubs += 1; }
        i = j + len;
    }
    buf.drain(..i);
    pubs
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let ws = a[1] == "ws";
    let addr = a[2].clone();
    let n: usize = a[3].parse().unwrap();
    let size: usize = a[4].parse().unwrap();
    let mut sub = Conn::open(ws, &addr).await;
    sub.send(connect("sub")).await;
    let mut buf = Vec::new();
    while buf.len() < 4 { sub.recv(&mut buf).await; }
    buf.clear();
    sub.send(vec![0x82, 6, 0, 1, 0, 1, b't', 0]).await;
    while buf.len() < 5 { sub.recv(&mut buf).await; }
    buf.clear();
    let mut publ = Conn::open(ws, &addr).await;
    publ.send(connect("pub")).await;
    let mut pb = Vec::new();
    while pb.len() < 4 { publ.recv(&mut pb).await; }
    let mut packet = vec![0x30];
    varint(2 + 1 + size, &mut packet);
    packet.extend_from_slice(&[0, 1, b't']);
    packet.extend(std::iter::repeat(b'x').take(size));
    let start = Instant::now();
    let recv = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            if !sub.recv(&mut buf).await { break; }
            got += count(&mut buf);
        }
        (got, start.elapsed())
    });
    let batch = 64;
    let mut sent = 0;
    while sent < n {
        let k = batch.min(n - sent);
        let mut b = Vec::with_capacity(k * packet.len());
        for _ in 0..k { b.extend_from_slice(&packet); }
        publ.send(b).await;
        sent += k;
    }
    let (got, el) = recv.await.unwrap();
    println!("{} got {got}/{n} x {size} B in {:.3} s: {:.0} msg/s", a[1], el.as_secs_f64(), got as f64 / el.as_secs_f64());
}
