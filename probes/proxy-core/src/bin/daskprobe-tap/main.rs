//! daskprobe-tap: records Dask message framing from packets, with no proxy in the way: for
//! connections that were open before recording started, or that do not pass through a proxy.
//!
//! usage: daskprobe-tap --capture FILE [--loopback] --port PORT=LABEL [--port ...]
//!
//! Captures the TCP segments to and from the listed ports (every interface, or with --loopback
//! loopback's alone, where a cluster all on this host sends them; on loopback each packet once)
//! through an AF_PACKET socket (root, or CAP_NET_RAW), puts each direction's
//! stream back together, parses it with the proxy's framing parser and writes the proxy's
//! capture records: a connection's open record names the listening side as both listener and
//! upstream. Prints "ready" once capturing. A "PORT=LABEL" line on stdin adds a port to watch (a
//! member that joined); it stops when its stdin ends: each direction still open is recorded as
//! closed then. The packets the kernel dropped (its ring was full) are counted in the capture
//! (drops records), and the stream gaps they left (gap records): nothing is lost unsaid.

mod packets;
mod streams;

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread;

use daskprobe_clock::now_ns;
use daskprobe_proxy::capture::{Capture, FLUSH_EVERY};
use daskprobe_proxy::failures::{log, Failures};
use daskprobe_proxy::peer::EarlyPids;

const NO_WAKE_MS: i32 = 40;

/// Set by SIGTERM (what a stop that ran out of patience sends): the reader ends at once, with the
/// blocks already handed over read and everything written, instead of losing what it holds.
static TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::Relaxed);
}

fn port_label(v: &str) -> Result<(u16, String), String> {
    let (port, label) = v.split_once('=').unwrap_or((v, ""));
    Ok((port.parse().map_err(|e| format!("port {v}: {e}"))?, label.to_string()))
}

struct Args {
    capture: String,
    ports: HashMap<u16, String>,
    on: packets::Interfaces,
}

fn parse_args() -> Result<Args, String> {
    let (mut capture, mut ports, mut on) = (None, HashMap::new(), packets::Interfaces::All);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--loopback" {
            on = packets::Interfaces::Loopback;
            continue;
        }
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--capture" => capture = Some(v),
            "--port" => {
                let (port, label) = port_label(&v)?;
                ports.insert(port, label);
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if ports.is_empty() {
        return Err("no --port to watch".into());
    }
    Ok(Args { capture: capture.ok_or("--capture FILE is required")?, ports, on })
}

fn main() {
    let Args { capture: path, mut ports, on } = parse_args().unwrap_or_else(|e| {
        log(format_args!("{e}"));
        std::process::exit(2)
    });
    let mut tap = packets::Tap::open(&ports.keys().copied().collect::<Vec<_>>(), on).unwrap_or_else(|e| {
        log(format_args!("cannot capture packets: {e}"));
        std::process::exit(1)
    });
    let capture = Capture::open(&path).unwrap_or_else(|e| {
        log(format_args!("cannot open {path}: {e}"));
        std::process::exit(1)
    });
    let (tx, rx) = channel();
    let mut writer = Writer { capture: Some(capture), rx, at: now_ns(), queued: false };
    let stdin_open = Arc::new(AtomicBool::new(true));
    let (joined_tx, joined) = channel();
    // Each line and the end of stdin wake the reader at once, not at its next packets.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    tap.wake_on(wake);
    {
        let stdin_open = stdin_open.clone();
        thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                match port_label(line.trim()) {
                    Ok(p) => joined_tx.send(p).unwrap_or(()),
                    Err(e) => log(format_args!("{e}")),
                }
                unsafe { libc::eventfd_write(wake, 1) };
            }
            stdin_open.store(false, Ordering::Relaxed);
            unsafe { libc::eventfd_write(wake, 1) };
        });
    }
    unsafe { libc::signal(libc::SIGTERM, on_term as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let mut streams = streams::Streams::new(ports.clone(), tx);
    let syns = match packets::Syns::open(&ports.keys().copied().collect::<Vec<_>>(), on) {
        Ok(syns) => {
            let (syns, early) = (Arc::new(syns), Arc::new(EarlyPids::default()));
            streams = streams.with_early_pids(early.clone());
            let reader = syns.clone();
            thread::spawn(move || loop {
                match reader.next() {
                    Ok((peer, ours)) => early.syn(peer, ours),
                    Err(e) => break log(format_args!("SYNs no longer read ({e}): openers are looked up a \
                                                      second after their streams are read")),
                }
            });
            Some(syns)
        }
        Err(e) => {
            log(format_args!("openers are looked up as their streams are read, up to {} ms late \
                              (a connection closed by then has none): {e}", packets::RETIRE_MS));
            None
        }
    };
    let failures = Failures::default();
    println!("ready");
    // Once told to stop, the kernel still holds the packets of its last block until it retires it
    // (RETIRE_MS): read on for three times that, so the end of the run is in, and no longer.
    let mut stop_at = None;
    let (mut drops, mut segments, mut late) = (0, 0u64, 0u64);
    while !TERM.load(Ordering::Relaxed) && stop_at.map_or(true, |at| now_ns() < at) {
        // without an eventfd, stdin's news is seen at the next packets or within NO_WAKE_MS
        let idle = if wake < 0 { NO_WAKE_MS } else { -1 };
        // what was queued is written within FLUSH_EVERY though no packet comes
        let idle = writer.due_in_ms().map_or(idle, |due| if idle < 0 { due } else { due.min(idle) });
        let timeout = stop_at.map_or(idle, |at: u64| (at.saturating_sub(now_ns()) / 1_000_000) as i32 + 1);
        match tap.next(timeout) {
            Ok(Some((t, seg))) => {
                streams.segment(t, &seg);
                writer.queued = true;
                segments += 1;
                late += stop_at.is_some() as u64;
            }
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {} // SIGTERM: TERM says
            Err(e) => failures.note(&format!("reading packets: {e}")),
        }
        let dropped = tap.take_drops();
        if dropped > 0 {
            drops += dropped;
            streams.dropped(now_ns(), dropped);
        }
        writer.maybe();
        while let Ok((port, label)) = joined.try_recv() {
            ports.insert(port, label.clone());
            let watched = ports.keys().copied().collect::<Vec<_>>();
            if let Err(e) = tap.watch(&watched) {
                failures.note(&format!("watching port {port}: {e}"));
            }
            if let Some(Err(e)) = syns.as_ref().map(|s| s.watch(&watched)) {
                failures.note(&format!("watching port {port}'s SYNs: {e}"));
            }
            streams.watch(port, label);
        }
        if stop_at.is_none() && !stdin_open.load(Ordering::Relaxed) {
            stop_at = Some(now_ns() + 3 * packets::RETIRE_MS as u64 * 1_000_000);
        }
    }
    // A reader starved of a CPU may be behind when its time is up: the blocks the kernel has handed
    // over already are read still (without waiting for more), else the run's last messages are lost;
    // up to the packets captured by then, so that a cluster that goes on talking (attach) cannot keep it.
    let end = if TERM.load(Ordering::Relaxed) { now_ns() } else { stop_at.unwrap_or(u64::MAX) };
    let mut after = 0u64;
    while let Ok(Some((t, seg))) = tap.next(0) {
        if t > end {
            break;
        }
        streams.segment(t, &seg);
        after += 1;
    }
    tap.count_drops();
    let dropped = tap.take_drops();
    if dropped > 0 {
        drops += dropped;
        streams.dropped(now_ns(), dropped);
    }
    let seeking = streams.finish(now_ns());
    // how it ended, for a capture that holds less than expected (a test's failure prints the log)
    let how = if TERM.load(Ordering::Relaxed) { "SIGTERM" } else { "its stdin's end" };
    log(format_args!("ended on {how}: {segments} segments read, {late} after stdin ended, {after} at the end; \
                      {seeking} directions never found a message start"));
    if drops > 0 {
        log(format_args!("the kernel dropped {drops} packets for want of room: the gaps they left are in the capture"));
    }
    drop(streams); // the reader's sender (a pid's lookup still running holds another)
    writer.write();
    if let Some(c) = writer.capture.as_mut() {
        c.ended();
    }
}

/// The capture, written by the reading thread itself when it is awake anyway (for packets) and
/// nearly FLUSH_EVERY has passed (blocks retire about as often), else when FLUSH_EVERY plus a
/// block's RETIRE_MS have: while packets come, their blocks wake it every RETIRE_MS, and a timer
/// of its own would wake it as often again (a writer thread of its own woke 10 times a second).
/// After a failed write (a full disk) it writes no more, and what is queued from then on is
/// dropped at once.
struct Writer {
    capture: Option<Capture>,
    rx: Receiver<Vec<u8>>,
    /// when it last wrote
    at: u64,
    /// segments were read since: records may be queued
    queued: bool,
}

impl Writer {
    fn maybe(&mut self) {
        if now_ns() - self.at >= FLUSH_EVERY.as_nanos() as u64 * 9 / 10 {
            self.write();
        }
    }

    /// Milliseconds until what may be queued is due to be written, if no packet wakes the reader
    /// before; None when nothing is.
    fn due_in_ms(&self) -> Option<i32> {
        let due = self.at + FLUSH_EVERY.as_nanos() as u64 + packets::RETIRE_MS as u64 * 1_000_000;
        self.queued.then(|| (due.saturating_sub(now_ns()) / 1_000_000) as i32 + 1)
    }

    fn write(&mut self) {
        let Some(c) = self.capture.as_mut() else {
            self.queued = false; // nothing is written any more
            return;
        };
        let before = c.end();
        let drained = c.drain(&self.rx);
        // a connection's pid comes from a thread of its own, after its open record: one write more
        self.at = now_ns();
        self.queued = c.end() > before;
        if let Err(e) = drained {
            c.stopped(&e, "reading goes on");
            self.capture = None;
            self.rx = channel().1; // the senders' records are refused from now on
        }
    }
}
