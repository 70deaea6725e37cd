//! daskprobe-sampler: py-spy's stack reader in a loop over many processes,
//! each sample stamped on the run's clock (CLOCK_MONOTONIC).
//!
//! usage: daskprobe-sampler --out FILE [--rate HZ] [--native]
//! Reads "PID NAME" lines on stdin: processes to sample, added at any time.
//!
//! Output, one record per line, tab-separated, append-only, flushed per round:
//!   F  frame_id  function  filename  line              (first time a frame is seen)
//!   S  t_ns  pid  tid  active  owns_gil  thread_name  frame_ids (leaf first, comma-separated)
//!   A  t_ns  pid  name                                  (attached)
//!   E  t_ns  pid  message                               (attach failed or process gone)
//!   L  t_ns  pid  read_ns                               (sample dropped: the read took > 2 ms)
//! t_ns is the midpoint of the read of that process's stacks, so it is within
//! read_ns / 2 <= 1 ms of every stack it reports.

use daskprobe_clock::now_ns;
use py_spy::config::LockingStrategy;
use py_spy::{Config, Frame, PythonSpy};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufWriter, Write};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const MAX_READ_NS: u64 = 2_000_000;

/// One field of a tab-separated line: no tabs, newlines or other control characters
/// (a non-blocking read can catch a frame mid-update and return garbage).
fn clean(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

struct Args {
    out: String,
    rate: f64,
    native: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { out: String::new(), rate: 100.0, native: false };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--out" => a.out = it.next().ok_or("--out needs a value")?,
            "--rate" => a.rate = it.next().ok_or("--rate needs a value")?.parse().map_err(|e| format!("{e}"))?,
            "--native" => a.native = true,
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if a.out.is_empty() || a.rate <= 0.0 {
        return Err("--out FILE is required and --rate must be positive".into());
    }
    Ok(a)
}

fn read_pids() -> Receiver<(i32, String)> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let mut parts = line.splitn(2, ' ');
            if let Some(Ok(pid)) = parts.next().map(str::parse) {
                let _ = tx.send((pid, parts.next().unwrap_or("").to_string()));
            }
        }
    });
    rx
}

struct Sampler<W: Write> {
    out: W,
    frames: HashMap<Frame, u64>,
}

impl<W: Write> Sampler<W> {
    fn frame_ids(&mut self, frames: &[Frame]) -> String {
        let mut ids = Vec::with_capacity(frames.len());
        for f in frames {
            // Look up before cloning: most frames were seen before, and this runs per sample.
            let id = match self.frames.get(f) {
                Some(&id) => id,
                None => {
                    let id = self.frames.len() as u64;
                    self.frames.insert(f.clone(), id);
                    let _ = writeln!(self.out, "F\t{id}\t{}\t{}\t{}", clean(&f.name), clean(&f.filename), f.line);
                    id
                }
            };
            ids.push(id.to_string());
        }
        ids.join(",")
    }

    /// One read of one process; false when the process is gone.
    fn sample(&mut self, pid: i32, spy: &mut PythonSpy) -> bool {
        let t0 = now_ns();
        let traces = spy.get_stack_traces();
        let took = now_ns() - t0;
        let t = t0 + took / 2;
        match traces {
            // A read that took longer than 2 ms cannot be placed within 1 ms: drop it.
            Ok(_) if took > MAX_READ_NS => {
                let _ = writeln!(self.out, "L\t{t}\t{pid}\t{took}");
                true
            }
            Ok(traces) => {
                for tr in traces {
                    let ids = self.frame_ids(&tr.frames);
                    let name = clean(tr.thread_name.as_deref().unwrap_or(""));
                    let tid = tr.os_thread_id.unwrap_or(tr.thread_id);
                    let _ = writeln!(self.out, "S\t{t}\t{pid}\t{tid}\t{}\t{}\t{name}\t{ids}",
                                     tr.active as u8, tr.owns_gil as u8);
                }
                true
            }
            Err(_) => {
                // a failed read of a live process is a lost sample, not the end
                let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
                if !alive {
                    let _ = writeln!(self.out, "E\t{t}\t{pid}\tprocess exited");
                }
                alive
            }
        }
    }
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("daskprobe-sampler: {e}");
        std::process::exit(2);
    });
    let mut config = Config::default();
    config.native = args.native;
    // Pausing the target costs it time; read its memory while it runs unless
    // native stacks are wanted (they need the pause).
    config.blocking = if args.native { LockingStrategy::Lock } else { LockingStrategy::NonBlocking };
    let file = OpenOptions::new().create(true).append(true).open(&args.out).expect("cannot open --out");
    let mut s = Sampler { out: BufWriter::with_capacity(1 << 20, file), frames: HashMap::new() };
    let new_pids = read_pids();
    let mut spies: Vec<(i32, PythonSpy)> = Vec::new();
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let mut next = Instant::now();
    println!("ready");
    loop {
        while let Ok((pid, name)) = new_pids.try_recv() {
            match PythonSpy::retry_new(pid as py_spy::Pid, &config, 20) {
                Ok(spy) => {
                    let _ = writeln!(s.out, "A\t{}\t{pid}\t{}", now_ns(), clean(&name));
                    spies.push((pid, spy));
                }
                Err(e) => {
                    let _ = writeln!(s.out, "E\t{}\t{pid}\t{}", now_ns(), clean(&format!("{name}: {e}")));
                }
            }
        }
        spies.retain_mut(|(pid, spy)| s.sample(*pid, spy));
        let _ = s.out.flush();
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now; // fell behind: skip, don't burst
        }
    }
}
