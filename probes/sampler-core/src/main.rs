//! daskprobe-sampler: samples the Python stacks of many processes, each
//! sample stamped on the run's clock (CLOCK_MONOTONIC). CPython 3.11 is read
//! by our own reader (cpython311.rs); other versions, and --native, by py-spy.
//!
//! usage: daskprobe-sampler --out FILE [--rate HZ] [--native] [--reader auto|pyspy]
//! Reads "PID NAME" lines on stdin: processes to sample, added at any time.
//!
//! Output, one record per line, tab-separated, append-only, flushed per round:
//!   F  frame_id  function  filename  line              (first time a frame is seen)
//!   S  t_ns  pid  tid  active  owns_gil  thread_name  frame_ids (leaf first, comma-separated)
//!   A  t_ns  pid  name  reader                          (attached)
//!   E  t_ns  pid  message                               (attach failed or process gone)
//!   L  t_ns  pid  read_ns                               (sample dropped: the read took > 2 ms)
//! t_ns is the midpoint of the read of that process's stacks, so it is within
//! read_ns / 2 <= 1 ms of every stack it reports.

mod cpython311;
mod frames;
mod procstat;
mod remote;

use cpython311::{Reader, ThreadSample};
use daskprobe_clock::now_ns;
use frames::{clean, Frames};
use py_spy::config::LockingStrategy;
use py_spy::{Config, PythonSpy};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufWriter, Write};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const MAX_READ_NS: u64 = 2_000_000;

struct Args {
    out: String,
    rate: f64,
    native: bool,
    pyspy_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { out: String::new(), rate: 100.0, native: false, pyspy_only: false };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--out" => a.out = it.next().ok_or("--out needs a value")?,
            "--rate" => a.rate = it.next().ok_or("--rate needs a value")?.parse().map_err(|e| format!("{e}"))?,
            "--native" => a.native = true,
            "--reader" => match it.next().as_deref() {
                Some("auto") => a.pyspy_only = false,
                Some("pyspy") => a.pyspy_only = true,
                other => return Err(format!("--reader must be auto or pyspy, not {other:?}")),
            },
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

/// One sampled process: py-spy attached to it (it finds the interpreter and
/// names threads), and our reader when the interpreter is one it knows.
struct Target {
    pid: i32,
    spy: PythonSpy,
    fast: Option<Reader>,
    /// which reader reads it, and why, for the capture's `A` line
    reader: &'static str,
    names: HashMap<u64, String>,
    named_at: Instant,
}

impl Target {
    fn attach(pid: i32, config: &Config, pyspy_only: bool) -> Result<Target, String> {
        let mut spy = PythonSpy::retry_new(pid as py_spy::Pid, config, 20).map_err(|e| format!("{e}"))?;
        let ours = !pyspy_only && !config.native && cfg!(target_arch = "x86_64")
            && spy.version.major == 3 && spy.version.minor == 11;
        let mut fast = ours.then(|| Reader::new(pid, spy.addresses.interpreter_address, spy.addresses.threadstate_address));
        // A thread starting or ending between the two reads can spoil one check.
        let agreed = fast.as_ref().is_some_and(|r| (0..3).any(|_| agrees(r, &mut spy)));
        let reader = match (ours, agreed) {
            (true, true) => "cpython311",
            (true, false) => "py-spy (our CPython 3.11 reader disagreed with it on this interpreter)",
            _ => "py-spy",
        };
        if !agreed {
            fast = None;
        }
        Ok(Target { pid, spy, fast, reader, names: HashMap::new(), named_at: Instant::now() })
    }

    fn read(&mut self, frames: &mut Frames, out: &mut impl Write) -> Option<Vec<ThreadSample>> {
        if let Some(r) = self.fast.as_mut() {
            // Memory read while the target runs can be torn into any bytes; a bug
            // that lets them through costs one sample (logged), not the run's sampling.
            return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.sample(frames, out))).ok().flatten();
        }
        let traces = self.spy.get_stack_traces().ok()?;
        Some(traces.into_iter().map(|tr| {
            let ids: Vec<String> = tr.frames.iter()
                .map(|f| frames.id(out, &f.name, &f.filename, f.line).to_string()).collect();
            let tid = tr.os_thread_id.unwrap_or(tr.thread_id);
            self.names.insert(tid, tr.thread_name.unwrap_or_default());
            ThreadSample { tid, active: tr.active, owns_gil: tr.owns_gil, frame_ids: ids.join(",") }
        }).collect())
    }

    /// Thread names come from py-spy (it reads threading's table): asked again
    /// when a thread we have not seen appears, and at most once a second while
    /// one is unnamed (a thread can run before threading registers its name).
    fn name_threads(&mut self, samples: &[ThreadSample]) {
        if self.fast.is_none() {
            return; // py-spy's own reads name the threads (Target::read)
        }
        let new = samples.iter().any(|s| !self.names.contains_key(&s.tid));
        let unnamed = samples.iter().any(|s| self.names.get(&s.tid).is_some_and(String::is_empty));
        if !new && !(unnamed && self.named_at.elapsed() >= Duration::from_secs(1)) {
            return;
        }
        self.named_at = Instant::now();
        for tr in self.spy.get_stack_traces().unwrap_or_default() {
            self.names.insert(tr.os_thread_id.unwrap_or(tr.thread_id), tr.thread_name.unwrap_or_default());
        }
        for s in samples {
            self.names.entry(s.tid).or_default();
        }
    }
}

/// Our reader is used only where it reads what py-spy reads: the outermost
/// function of every thread both see, and at least one such thread.
fn agrees(r: &Reader, spy: &mut PythonSpy) -> bool {
    let ours = r.outermost_functions();
    let Ok(traces) = spy.get_stack_traces() else { return false };
    let mut same = 0;
    for tr in traces {
        let (Some(tid), Some(outermost)) = (tr.os_thread_id, tr.frames.last()) else { continue };
        match ours.get(&tid) {
            Some(f) if *f == outermost.name => same += 1,
            Some(_) => return false,
            None => {}
        }
    }
    same > 0
}

struct Sampler<W: Write> {
    out: W,
    frames: Frames,
}

impl<W: Write> Sampler<W> {
    /// One read of one process; false when the process is gone.
    fn sample(&mut self, t: &mut Target) -> bool {
        let t0 = now_ns();
        let samples = t.read(&mut self.frames, &mut self.out);
        let took = now_ns() - t0;
        let at = t0 + took / 2;
        let pid = t.pid;
        match samples {
            // A read that took longer than 2 ms cannot be placed within 1 ms: drop it.
            Some(_) if took > MAX_READ_NS => {
                let _ = writeln!(self.out, "L\t{at}\t{pid}\t{took}");
                true
            }
            Some(samples) => {
                t.name_threads(&samples);
                for s in samples {
                    let name = clean(&t.names[&s.tid]);
                    let _ = writeln!(self.out, "S\t{at}\t{pid}\t{}\t{}\t{}\t{name}\t{}",
                                     s.tid, s.active as u8, s.owns_gil as u8, s.frame_ids);
                }
                true
            }
            None => {
                // a failed read of a live process is a lost sample, not the end
                let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
                if !alive {
                    let _ = writeln!(self.out, "E\t{at}\t{pid}\tprocess exited");
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
    let mut s = Sampler { out: BufWriter::with_capacity(1 << 20, file), frames: Frames::default() };
    let new_pids = read_pids();
    let mut targets: Vec<Target> = Vec::new();
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let mut next = Instant::now();
    println!("ready");
    loop {
        while let Ok((pid, name)) = new_pids.try_recv() {
            match Target::attach(pid, &config, args.pyspy_only) {
                Ok(t) => {
                    let _ = writeln!(s.out, "A\t{}\t{pid}\t{}\t{}", now_ns(), clean(&name), t.reader);
                    targets.push(t);
                }
                Err(e) => {
                    let _ = writeln!(s.out, "E\t{}\t{pid}\t{}", now_ns(), clean(&format!("{name}: {e}")));
                }
            }
        }
        targets.retain_mut(|t| s.sample(t));
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
