//! daskprobe-proxy: forwards TCP bytes unchanged and records Dask message
//! framing to an append-only capture file.
//!
//! usage: daskprobe-proxy --capture FILE --route LISTEN,UPSTREAM,LABEL [--route ...] [--delay-us N]
//!
//! Prints "ready" on stdout once every route listens. One thread per
//! direction of each connection: read, forward at once, then parse lengths.
//! Records go through a channel to a single writer that drains and flushes
//! every 50 ms.

mod peer;
mod record;

use std::fs::OpenOptions;
use std::io::{BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use daskprobe_clock::now_ns;
use daskprobe_proxy::framing;
use std::thread;
use std::time::Duration;

const READ_BUF: usize = 256 << 10;
const FLUSH_EVERY: Duration = Duration::from_millis(50);

struct Route {
    listen: String,
    upstream: String,
    label: String,
}

fn parse_args() -> Result<(String, Vec<Route>, Duration), String> {
    let mut args = std::env::args().skip(1);
    let (mut capture, mut routes, mut delay) = (None, Vec::new(), Duration::ZERO);
    while let Some(a) = args.next() {
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--capture" => capture = Some(v),
            "--delay-us" => delay = Duration::from_micros(v.parse().map_err(|e| format!("--delay-us: {e}"))?),
            "--route" => {
                let p: Vec<&str> = v.splitn(3, ',').collect();
                if p.len() != 3 {
                    return Err(format!("--route wants LISTEN,UPSTREAM,LABEL, got {v}"));
                }
                routes.push(Route { listen: p[0].into(), upstream: p[1].into(), label: p[2].into() });
            }
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok((capture.ok_or("--capture is required")?, routes, delay))
}

/// Drain the queue and flush every FLUSH_EVERY. The writer sleeps instead of
/// blocking in recv(), so forwarding threads never pay for waking it: on a
/// 2-core machine a wake-up and a write per message compete with the scheduler.
fn writer(path: String, rx: Receiver<Vec<u8>>) {
    let file = OpenOptions::new().create(true).append(true).open(&path);
    let mut out = BufWriter::with_capacity(1 << 20, file.expect("cannot open capture file"));
    loop {
        thread::sleep(FLUSH_EVERY);
        loop {
            match rx.try_recv() {
                Ok(rec) => out.write_all(&rec).expect("capture write failed"),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    out.flush().expect("capture flush failed");
                    return;
                }
            }
        }
        out.flush().expect("capture flush failed");
    }
}

fn pump(conn: u32, dir: u8, mut src: TcpStream, mut dst: TcpStream, tx: Sender<Vec<u8>>, delay: Duration) {
    let mut buf = vec![0u8; READ_BUF];
    let mut parser = framing::Parser::new();
    let mut events = Vec::new();
    let mut total = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let read = now_ns();
        if !delay.is_zero() && parser.at_boundary() {
            thread::sleep(delay); // --delay-us: hold each burst that starts a message
        }
        // Stamp delivery before writing: the write wakes the receiver, which
        // may run before this thread reads the clock again.
        let sending = now_ns();
        if dst.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
        parser.feed(&buf[..n], read, sending, &mut events);
        for ev in events.drain(..) {
            let _ = tx.send(record::event(conn, dir, ev));
        }
    }
    let now = now_ns();
    if let Some(ev) = parser.finish(now) {
        let _ = tx.send(record::event(conn, dir, ev));
    }
    // Pass the half-close on; a hard error ends both directions.
    let _ = dst.shutdown(Shutdown::Write);
    let _ = tx.send(record::close(conn, dir, now, total));
}

fn serve(route: Route, listener: TcpListener, ids: Arc<AtomicU32>, tx: Sender<Vec<u8>>, delay: Duration) {
    for down in listener.incoming().flatten() {
        let up = match TcpStream::connect(&route.upstream) {
            Ok(up) => up,
            Err(e) => {
                eprintln!("daskprobe-proxy: {} -> {}: {e}", route.label, route.upstream);
                continue;
            }
        };
        let conn = ids.fetch_add(1, Ordering::Relaxed);
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (peer, ours) = (down.peer_addr().unwrap(), down.local_addr().unwrap());
        let up_local = up.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let _ = tx.send(record::open(conn, now_ns(), &route.label, &route.listen, &peer.to_string(),
                                     &route.upstream, &up_local));
        let txp = tx.clone();
        thread::spawn(move || {
            let _ = txp.send(record::peer(conn, peer::pid_of(&peer, &ours).unwrap_or(-1)));
        });
        let (d2, u2, tx2) = (down.try_clone().unwrap(), up.try_clone().unwrap(), tx.clone());
        thread::spawn(move || pump(conn, 0, d2, u2, tx2, delay));
        let tx3 = tx.clone();
        thread::spawn(move || pump(conn, 1, up, down, tx3, delay));
    }
}

fn main() {
    let (capture, routes, delay) = parse_args().unwrap_or_else(|e| {
        eprintln!("daskprobe-proxy: {e}");
        std::process::exit(2);
    });
    let (tx, rx) = channel();
    let writer_thread = thread::spawn(move || writer(capture, rx));
    let ids = Arc::new(AtomicU32::new(1));
    let mut servers = Vec::new();
    for route in routes {
        let listener = TcpListener::bind(&route.listen).unwrap_or_else(|e| {
            eprintln!("daskprobe-proxy: cannot listen on {}: {e}", route.listen);
            std::process::exit(1);
        });
        let (ids, tx) = (ids.clone(), tx.clone());
        servers.push(thread::spawn(move || serve(route, listener, ids, tx, delay)));
    }
    drop(tx);
    println!("ready");
    let _ = std::io::stdout().flush();
    for s in servers {
        let _ = s.join();
    }
    let _ = writer_thread.join();
}
