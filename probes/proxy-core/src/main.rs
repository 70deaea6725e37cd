//! daskprobe-proxy: forwards TCP bytes unchanged and records Dask message
//! framing to an append-only capture file.
//!
//! usage: daskprobe-proxy --capture FILE --route LISTEN,UPSTREAM,LABEL [--route ...] [--delay-us N]
//!                        [--allow-uids UID,UID...]
//!
//! With --allow-uids it serves only connections that processes of those users opened (the kernel
//! says whose, sock_diag): a Dask server runs code for whoever connects, and the cluster behind
//! the proxy must not run any local user's.
//!
//! Prints "ready" on stdout once every route listens, and stops when its
//! stdin ends: it records each direction still open as closed then (with
//! the bytes it forwarded), writes what is queued, and exits. One thread per
//! direction of each connection: read, forward at once, then parse lengths.
//! Records go through a channel to a single writer that drains and flushes
//! every 100 ms. Nothing a peer or the OS does (resets, fd limits, a full
//! disk) ends a route: such failures are logged by kind, and connections
//! dropped for them are recorded as lost.

use daskprobe_clock::now_ns;
use daskprobe_proxy::capture::Capture;
use daskprobe_proxy::failures::Failures;
use daskprobe_proxy::{framing, peer, record};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const READ_BUF: usize = 256 << 10;
const DELAY_QUEUE: usize = 64;
/// Pause after a failed accept(): out of fds the pending connection waits in
/// the backlog until one is freed, and retrying at once would spin.
const BACKOFF: Duration = Duration::from_millis(10);
/// Linux errnos of a shortage that passes: ENOMEM, ENFILE, EMFILE, ENOBUFS.
const SHORTAGE: [i32; 4] = [12, 23, 24, 105];

struct Route {
    listen: String,
    upstream: String,
    label: String,
}

struct Args {
    capture: String,
    routes: Vec<Route>,
    delay: Duration,
    allow: Vec<u32>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut capture, mut routes, mut delay, mut allow) = (None, Vec::new(), Duration::ZERO, Vec::new());
    while let Some(a) = args.next() {
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--capture" => capture = Some(v),
            "--delay-us" => delay = Duration::from_micros(v.parse().map_err(|e| format!("--delay-us: {e}"))?),
            "--allow-uids" => {
                allow = v.split(',').map(|u| u.parse().map_err(|e| format!("--allow-uids: {e}"))).collect::<Result<_, _>>()?
            }
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
    Ok(Args { capture: capture.ok_or("--capture is required")?, routes, delay, allow })
}

/// The directions still open, with the bytes each has forwarded: what a stop records as closed.
type Open = Arc<Mutex<HashMap<(u32, u8), Arc<AtomicU64>>>>;

/// The capture side of one connection direction: parse what was forwarded, record it.
struct Recorder {
    conn: u32,
    dir: u8,
    parser: framing::Parser,
    events: Vec<framing::Event>,
    tx: Sender<Vec<u8>>,
    total: Arc<AtomicU64>,
    open: Open,
}

impl Recorder {
    fn new(conn: u32, dir: u8, tx: Sender<Vec<u8>>, open: Open) -> Recorder {
        let total = Arc::new(AtomicU64::new(0));
        open.lock().unwrap().insert((conn, dir), total.clone());
        Recorder { conn, dir, parser: framing::Parser::new(), events: Vec::new(), tx, total, open }
    }

    /// Bytes read at `read` and handed on at `sent`, after they were written.
    fn forwarded(&mut self, bytes: &[u8], read: u64, sent: u64) {
        self.total.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.parser.feed(bytes, read, sent, &mut self.events);
        for ev in self.events.drain(..) {
            let _ = self.tx.send(record::event(self.conn, self.dir, ev));
        }
    }

    /// Pass the half-close on (a hard error ends both directions) and close the record.
    fn finish(mut self, dst: &TcpStream) {
        let now = now_ns();
        if let Some(ev) = self.parser.finish(now) {
            let _ = self.tx.send(record::event(self.conn, self.dir, ev));
        }
        let _ = dst.shutdown(Shutdown::Write);
        self.open.lock().unwrap().remove(&(self.conn, self.dir));
        let _ = self.tx.send(record::close(self.conn, self.dir, now, self.total.load(Ordering::Relaxed)));
    }
}

fn read_some(src: &mut TcpStream, buf: &mut [u8]) -> Option<usize> {
    loop {
        match src.read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

/// One connection direction: read, forward at once, then parse.
fn pump(conn: u32, dir: u8, mut src: TcpStream, mut dst: TcpStream, tx: Sender<Vec<u8>>, delay: Duration, open: Open) {
    if !delay.is_zero() {
        return pump_delayed(conn, dir, src, dst, tx, delay, open);
    }
    let mut buf = vec![0u8; READ_BUF];
    let mut rec = Recorder::new(conn, dir, tx, open);
    while let Some(n) = read_some(&mut src, &mut buf) {
        let read = now_ns();
        // Stamp delivery before writing: the write wakes the receiver, which
        // may run before this thread reads the clock again.
        let sent = now_ns();
        if dst.write_all(&buf[..n]).is_err() {
            break;
        }
        rec.forwarded(&buf[..n], read, sent);
    }
    rec.finish(&dst);
}

/// --delay-us: a link with that much latency. Every byte is handed on `delay`
/// after it was read, by a second thread, so bytes behind a held message are
/// not held longer (no head-of-line blocking, as a slow link has none). At most
/// DELAY_QUEUE reads wait in flight; beyond that the reader waits too.
fn pump_delayed(conn: u32, dir: u8, mut src: TcpStream, mut dst: TcpStream, tx: Sender<Vec<u8>>, delay: Duration,
                open: Open) {
    let (held_tx, held_rx) = sync_channel::<(u64, Vec<u8>)>(DELAY_QUEUE);
    let reader = thread::Builder::new().name(format!("c{conn}-delay")).spawn(move || {
        let mut buf = vec![0u8; READ_BUF];
        while let Some(n) = read_some(&mut src, &mut buf) {
            if held_tx.send((now_ns(), buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    let mut rec = Recorder::new(conn, dir, tx, open);
    for (read, bytes) in held_rx {
        let due = read + delay.as_nanos() as u64;
        let now = now_ns();
        if due > now {
            thread::sleep(Duration::from_nanos(due - now));
        }
        let sent = now_ns();
        if dst.write_all(&bytes).is_err() {
            break;
        }
        rec.forwarded(&bytes, read, sent);
    }
    rec.finish(&dst);
    drop(reader); // it ends when its peer closes or the queue is gone
}

/// What the threads of every route share.
struct Shared {
    ids: AtomicU32,
    tx: Sender<Vec<u8>>,
    delay: Duration,
    failures: Failures,
    open: Open,
    allow: Vec<u32>,
}

impl Shared {
    /// A connection dropped before it was served: logged by kind, and
    /// recorded so that the capture's reader can count it.
    fn lose(&self, label: &str, stage: &str, e: &io::Error) {
        let reason = format!("{stage}: {e}");
        self.failures.note(&format!("{label}: {reason}"));
        let _ = self.tx.send(record::lost(now_ns(), label, &reason));
    }
}

fn serve(route: Route, listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept() {
            Ok((down, _)) => {
                if let Err((stage, e)) = start(&route, down, &shared) {
                    shared.lose(&route.label, stage, &e);
                }
            }
            Err(e) if e.raw_os_error().is_some_and(|n| SHORTAGE.contains(&n)) => {
                shared.failures.note(&format!("{}: accept: {e}", route.label));
                thread::sleep(BACKOFF);
            }
            Err(e) => {
                shared.lose(&route.label, "accept", &e);
                thread::sleep(BACKOFF); // an error that repeats must not spin either
            }
        }
    }
}

/// Sets up an accepted connection: its upstream, both pumps, its records.
/// On failure nothing about it has been recorded: the caller records it lost.
fn start(route: &Route, down: TcpStream, shared: &Shared) -> Result<(), (&'static str, io::Error)> {
    let at = |stage: &'static str| move |e: io::Error| (stage, e);
    // Fails once the peer has reset, even while it waited to be accepted.
    let peer = down.peer_addr().map_err(at("peer gone before it was served"))?;
    let ours = down.local_addr().map_err(at("peer gone before it was served"))?;
    if !shared.allow.is_empty() && !peer::opener_uid(&peer, &ours).is_some_and(|u| shared.allow.contains(&u)) {
        // Not the cluster's: refused, not lost (nothing of the run's went missing), and said in the log.
        shared.failures.note(&format!("{}: refused a connection not opened by the cluster's user", route.label));
        return Ok(());
    }
    let up = TcpStream::connect(&route.upstream).map_err(at("upstream connect"))?;
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let up_local = up.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let (d2, u2) = (down.try_clone().map_err(at("socket clone"))?, up.try_clone().map_err(at("socket clone"))?);
    let go0 = spawn_pump(0, d2, u2, shared).map_err(at("thread"))?;
    let go1 = spawn_pump(1, up, down, shared).map_err(at("thread"))?;
    let conn = shared.ids.fetch_add(1, Ordering::Relaxed);
    let _ = shared.tx.send(record::open(conn, now_ns(), &route.label, &route.listen, &peer.to_string(),
                                        &route.upstream, &up_local));
    peer::record_pid_of(conn, peer, ours, shared.tx.clone());
    let _ = (go0.send(conn), go1.send(conn));
    Ok(())
}

/// The thread's kernel name (at most 15 bytes), which the run's thread table and trace show: a pump's
/// connection is known only once it runs.
fn name_this_thread(name: &str) {
    let mut bytes = [0u8; 16];
    let n = name.len().min(15);
    bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `bytes` is.
    unsafe { libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// A pump thread that starts when sent its connection's id, so that both
/// directions' threads exist before the connection is recorded; dropping the
/// sender instead ends it and closes its sockets.
fn spawn_pump(dir: u8, src: TcpStream, dst: TcpStream, shared: &Shared) -> io::Result<Sender<u32>> {
    let (go, wait) = channel();
    let (tx, delay, open) = (shared.tx.clone(), shared.delay, shared.open.clone());
    thread::Builder::new().spawn(move || {
        if let Ok(conn) = wait.recv() {
            name_this_thread(&format!("c{conn}-to-{}", ["srv", "cli"][dir as usize]));
            pump(conn, dir, src, dst, tx, delay, open);
        }
    })?;
    Ok(go)
}

fn main() {
    let Args { capture, routes, delay, allow } = parse_args().unwrap_or_else(|e| {
        eprintln!("daskprobe-proxy: {e}");
        std::process::exit(2);
    });
    let out = Capture::open(&capture).unwrap_or_else(|e| {
        eprintln!("daskprobe-proxy: cannot open capture file {capture}: {e}");
        std::process::exit(1);
    });
    let (tx, rx) = channel();
    let stopping = Arc::new(AtomicBool::new(false));
    let stop_flag = stopping.clone();
    let writer_thread = thread::Builder::new().name("capture".into()).spawn(move || out.run(rx, &stop_flag))
        .expect("cannot start the capture thread");
    let open: Open = Arc::default();
    let shared = Arc::new(Shared { ids: AtomicU32::new(1), tx: tx.clone(), delay, failures: Failures::default(),
                                   open: open.clone(), allow });
    for route in routes {
        let listener = TcpListener::bind(&route.listen).unwrap_or_else(|e| {
            eprintln!("daskprobe-proxy: cannot listen on {}: {e}", route.listen);
            std::process::exit(1);
        });
        let shared = shared.clone();
        let _ = thread::Builder::new().name(format!("accept {}", route.label)).spawn(move || serve(route, listener, shared));
    }
    drop(shared);
    println!("ready");
    let _ = std::io::stdout().flush();
    let _ = io::stdin().read_to_end(&mut Vec::new()); // until daskprobe closes it (or is gone)
    let now = now_ns();
    for (&(conn, dir), total) in open.lock().unwrap().iter() {
        let _ = tx.send(record::close(conn, dir, now, total.load(Ordering::Relaxed)));
    }
    stopping.store(true, Ordering::Relaxed);
    writer_thread.thread().unpark();
    let _ = writer_thread.join();
    std::process::exit(0);
}
