//! tokio-tungstenite 0.26 vs fastwebsockets 0.10, server side, as the broker would use them:
//! many small binary frames read from and written to a WebSocket over loopback.
//!
//! `ws-libs server tungstenite|fast PORT` serves one library on one single-threaded runtime
//! (pin it to a core). `ws-libs client PORT MODE N SIZE` runs one measurement against it and
//! prints msgs/s and the server's CPU microseconds per message:
//!   read:  the client streams N masked binary frames of SIZE bytes; the server reads them all.
//!   write: the server writes N binary frames of SIZE bytes, flushing every 64 (one socket
//!          write per 64 frames, as the broker flushes a batch); the client reads them all.
//! The client is raw TCP, the same for both servers; the HTTP upgrade is the same code for both
//! (tungstenite's `derive_accept_key`) and is not timed. The server reports its own CPU time
//! (getrusage) for the timed part in the last frame it sends.

use std::time::Instant;

use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role as TRole;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const FLUSH_EVERY: u64 = 64;

fn cpu_us() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// Reads the upgrade request, answers 101; returns the request path.
async fn upgrade(tcp: &mut TcpStream) -> Res<String> {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Err("closed during upgrade".into());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&req).to_string();
    let path = text.split_whitespace().nth(1).ok_or("no path")?.to_string();
    let key = text
        .lines()
        .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
        .ok_or("no key")?
        .trim()
        .to_string();
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n",
        derive_accept_key(key.as_bytes())
    );
    tcp.write_all(resp.as_bytes()).await?;
    Ok(path)
}

fn parse(path: &str) -> Res<(String, u64, usize)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Ok((parts[0].to_string(), parts[1].parse()?, parts[2].parse()?))
}

async fn serve_tungstenite(mut tcp: TcpStream) -> Res<()> {
    let (mode, n, size) = parse(&upgrade(&mut tcp).await?)?;
    let mut ws = WebSocketStream::from_raw_socket(tcp, TRole::Server, None).await;
    let payload = vec![7u8; size];
    let t0 = cpu_us();
    if mode == "read" {
        let mut got = 0u64;
        while got < n {
            match ws.next().await.ok_or("closed")?? {
                Message::Binary(b) => {
                    std::hint::black_box(&b);
                    got += 1;
                }
                _ => return Err("unexpected message".into()),
            }
        }
    } else {
        for i in 0..n {
            ws.feed(Message::Binary(payload.clone().into())).await?;
            if (i + 1) % FLUSH_EVERY == 0 {
                ws.flush().await?;
            }
        }
    }
    let cpu = cpu_us() - t0;
    ws.send(Message::Binary(cpu.to_string().into_bytes().into()))
        .await?;
    while ws.next().await.is_some() {}
    Ok(())
}

async fn serve_fast(mut tcp: TcpStream) -> Res<()> {
    let (mode, n, size) = parse(&upgrade(&mut tcp).await?)?;
    let mut ws =
        WebSocket::after_handshake(BufWriter::with_capacity(128 * 1024, tcp), Role::Server);
    ws.set_writev(false);
    ws.set_auto_close(true);
    let payload = vec![7u8; size];
    let t0 = cpu_us();
    if mode == "read" {
        let mut got = 0u64;
        while got < n {
            let frame = ws.read_frame().await?;
            match frame.opcode {
                OpCode::Binary => {
                    std::hint::black_box(&frame.payload);
                    got += 1;
                }
                _ => return Err("unexpected frame".into()),
            }
        }
    } else {
        for i in 0..n {
            // An owned payload per frame, as tungstenite's Message::Binary gets: the broker
            // hands each library a buffer it gives away.
            ws.write_frame(Frame::binary(Payload::Owned(payload.clone())))
                .await?;
            if (i + 1) % FLUSH_EVERY == 0 {
                ws.flush().await?;
            }
        }
    }
    let cpu = cpu_us() - t0;
    ws.write_frame(Frame::binary(Payload::Owned(cpu.to_string().into_bytes())))
        .await?;
    ws.flush().await?;
    loop {
        match ws.read_frame().await {
            Ok(f) if f.opcode == OpCode::Close => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

async fn server(lib: String, port: u16) -> Res<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let r = if lib == "fast" {
            serve_fast(tcp).await
        } else {
            serve_tungstenite(tcp).await
        };
        if let Err(e) = r {
            eprintln!("connection: {e}");
        }
    }
}

fn frame_header(len: usize, masked: bool) -> Vec<u8> {
    let m = if masked { 0x80 } else { 0 };
    let mut h = vec![0x82];
    if len < 126 {
        h.push(m | len as u8);
    } else if len < 65536 {
        h.push(m | 126);
        h.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        h.push(m | 127);
        h.extend_from_slice(&(len as u64).to_be_bytes());
    }
    h
}

/// Reads one unmasked server frame's payload from `buf` (filling it from `tcp`).
async fn read_frame(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Res<Vec<u8>> {
    loop {
        if buf.len() >= 2 {
            let len7 = (buf[1] & 0x7f) as usize;
            let (hl, len) = match len7 {
                126 if buf.len() >= 4 => (4, u16::from_be_bytes([buf[2], buf[3]]) as usize),
                127 if buf.len() >= 10 => (10, u64::from_be_bytes(buf[2..10].try_into()?) as usize),
                126 | 127 => (usize::MAX, 0),
                l => (2, l),
            };
            if hl != usize::MAX && buf.len() >= hl + len {
                let p = buf[hl..hl + len].to_vec();
                buf.drain(..hl + len);
                return Ok(p);
            }
        }
        let mut chunk = [0u8; 65536];
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Err("server closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn client(port: u16, mode: String, n: u64, size: usize) -> Res<()> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let req = format!(
        "GET /{mode}/{n}/{size} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let k = tcp.read(&mut chunk).await?;
        if k == 0 {
            return Err("closed".into());
        }
        buf.extend_from_slice(&chunk[..k]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    buf.drain(..end);
    let start = Instant::now();
    let frame_len;
    if mode == "read" {
        // 256 masked frames in one buffer, written N/256 times (and the rest).
        let key = [0x12u8, 0x34, 0x56, 0x78];
        let mut one = frame_header(size, true);
        one.extend_from_slice(&key);
        one.extend((0..size).map(|i| 7u8 ^ key[i % 4]));
        frame_len = one.len();
        let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 256).collect();
        let (mut rd, mut wr) = tcp.into_split();
        let writer = tokio::spawn(async move {
            let mut left = n;
            while left > 0 {
                let k = left.min(256);
                wr.write_all(&batch[..k as usize * one.len()]).await?;
                left -= k;
            }
            Ok::<_, std::io::Error>(wr)
        });
        // The server's one answer: its CPU time.
        let mut tcp_buf = buf;
        let mut chunk = [0u8; 256];
        let cpu: u64 = loop {
            if tcp_buf.len() >= 2 && tcp_buf.len() >= 2 + (tcp_buf[1] & 0x7f) as usize {
                let l = (tcp_buf[1] & 0x7f) as usize;
                break String::from_utf8_lossy(&tcp_buf[2..2 + l]).parse()?;
            }
            let k = rd.read(&mut chunk).await?;
            if k == 0 {
                return Err("server closed".into());
            }
            tcp_buf.extend_from_slice(&chunk[..k]);
        };
        let secs = start.elapsed().as_secs_f64();
        let wr = writer.await??;
        report(&mode, n, size, frame_len, secs, cpu);
        drop(wr);
        return Ok(());
    }
    frame_len = frame_header(size, false).len() + size;
    let data = n as usize * frame_len;
    // Count the data frames' bytes without keeping them; keep what follows (the CPU frame).
    let mut received = buf.len().min(data);
    buf.drain(..received);
    let mut big = vec![0u8; 256 * 1024];
    while received < data {
        let k = tcp.read(&mut big).await?;
        if k == 0 {
            return Err("server closed".into());
        }
        let take = k.min(data - received);
        received += take;
        buf.extend_from_slice(&big[take..k]);
    }
    let cpu: u64 = String::from_utf8_lossy(&read_frame(&mut tcp, &mut buf).await?).parse()?;
    let secs = start.elapsed().as_secs_f64();
    report(&mode, n, size, frame_len, secs, cpu);
    Ok(())
}

fn report(mode: &str, n: u64, size: usize, frame_len: usize, secs: f64, cpu_us: u64) {
    println!(
        "{mode} size={size} frames={n} wire={frame_len}B: {:.0} msgs/s, server CPU {:.3} us/msg ({:.0}% of a core)",
        n as f64 / secs,
        cpu_us as f64 / n as f64,
        100.0 * cpu_us as f64 / 1e6 / secs
    );
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.get(1).map(String::as_str) {
        Some("server") => rt.block_on(server(args[2].clone(), args[3].parse()?)),
        Some("client") => rt.block_on(client(
            args[2].parse()?,
            args[3].clone(),
            args[4].parse()?,
            args[5].parse()?,
        )),
        _ => Err(
            "usage: ws-libs server tungstenite|fast PORT | client PORT read|write N SIZE".into(),
        ),
    }
}
