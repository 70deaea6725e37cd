//! daskprobe-sampler: samples the Python stacks of many processes, each
//! sample stamped on the run's clock (CLOCK_MONOTONIC). CPython 3.10 to 3.13
//! are read by our own reader (cpython.rs); other versions, and --native, by py-spy.
//!
//! usage: daskprobe-sampler [--out FILE] [--rate HZ] [--native] [--reader auto|pyspy] [--poll] [--fixed]
//!                          [--proc FILE --threads FILE]
//! Reads lines on stdin, at any time: "PID NAME", a process to sample (into
//! --out); "proc PID", a process to read /proc for (procs.rs: the proc probe's
//! captures, at the wakes sampling makes anyway); "read", to read every thread
//! of every process now (with ticks, those off a CPU: the others are ticked),
//! answered by "read" on stdout once written (daskprobe
//! asks as the command ends: a thread started since the last read of the
//! threads off a CPU, and never ticked, would otherwise go unread).
//!
//! A thread is read when a CPU's tick finds it on the CPU (ticks.rs): by
//! BPF at the tick, for the Python threads our reader has listed
//! (tickprog.rs; the copies are named here every 200 ms), else by the
//! sampler, woken for that thread (py-spy's reader reads them all, and only
//! those ticked count as ticked); and every OFF_CPU_EVERY, for the threads
//! off a CPU. Where perf events cannot be opened, and with --poll, every
//! thread is read at the rate (polling), or less often where that would cost
//! over 1.5% of the cluster's CPU (pace.rs; --fixed: at the rate). A process whose CPU clock has not
//! moved since its last read (polled, or of its threads off a CPU) is not read again: that read is repeated.
//!
//! Output: the lines defined by LINES in daskprobe/probes/pyspy.py
//! (docs/formats.md), written by lines.rs and frames.rs, append-only, flushed
//! every FLUSH_EVERY and when told to stop (SIGTERM, SIGINT, SIGHUP). An S
//! line's t_ns is the tick's time for a stack BPF copied; for a read by the
//! sampler, the midpoint of the read of that process's stacks, so it is
//! within read_ns / 2 <= 1 ms of every stack it reports but a stale one (kept
//! up to 100 ms for a thread off a CPU: cpython.rs); a read that took longer
//! is dropped, as an L line.

/// A line in the sampler's log (stderr: the run's logs/sampler.log), never a panic where it cannot be
/// written (a full disk), as eprintln! would: the capture already written must not be lost to it.
macro_rules! log {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "daskprobe-sampler: {}", format_args!($($t)*));
    }};
}

mod bpf;
mod cpython;
mod frames;
mod jitter;
mod layout;
mod lines;
mod linetable;
mod mapped;
mod names;
mod pace;
mod procstat;
mod procs;
mod pthread;
mod remote;
mod text;
mod threads;
mod tickprog;
mod ticks;

use cpython::{Read, Reader, ThreadSample};
use daskprobe_clock::now_ns;
use frames::{clean, Frames};
use pace::Pace;
use py_spy::config::LockingStrategy;
use py_spy::python_process_info::PythonProcessInfo;
use py_spy::{Config, PythonSpy};
use remote::Remote;
use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};
use threads::InBpf;
use ticks::{Copied, Tick, Ticks};

const MAX_READ_NS: u64 = 2_000_000;
/// reads made again at most, of a process whose last read was dropped (too slow to place)
const LAST_READ_TRIES: usize = 3;
/// A write per round was a tenth of the sampler's CPU at 100 Hz; a kill -9 costs at most this much.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// With ticks, how often the threads off a CPU are read (the stacks they wait in, the GIL holder), and
/// the copies drained: at 100 ms this was a third of the sampler's CPU on 10 ms tasks.
const OFF_CPU_EVERY: Duration = Duration::from_millis(200);
// with ticks, /proc is read at these wake-ups: they must come at least as often as its readings are due
const _: () = assert!(OFF_CPU_EVERY.as_millis() <= procs::PERIOD.as_millis());

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// A signal to end sets STOP: the loop flushes what it holds, then exits.
fn stop_on_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        unsafe { libc::signal(sig, stop as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}
/// first and longest wait before asking py-spy again for the name of an unnamed thread
const NAME_RETRY: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

struct Args {
    out: Option<String>,
    /// proc.tsv and threads.tsv
    procs: Option<(String, String)>,
    rate: f64,
    native: bool,
    pyspy_only: bool,
    poll: bool,
    fixed: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { out: None, procs: None, rate: 100.0, native: false, pyspy_only: false, poll: false,
                        fixed: false };
    let (mut proc, mut threads) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--out" => a.out = Some(it.next().ok_or("--out needs a value")?),
            "--proc" => proc = Some(it.next().ok_or("--proc needs a value")?),
            "--threads" => threads = Some(it.next().ok_or("--threads needs a value")?),
            "--rate" => a.rate = it.next().ok_or("--rate needs a value")?.parse().map_err(|e| format!("{e}"))?,
            "--native" => a.native = true,
            "--poll" => a.poll = true,
            "--fixed" => a.fixed = true,
            "--reader" => match it.next().as_deref() {
                Some("auto") => a.pyspy_only = false,
                Some("pyspy") => a.pyspy_only = true,
                other => return Err(format!("--reader must be auto or pyspy, not {other:?}")),
            },
            _ => return Err(format!("unknown option {k}")),
        }
    }
    a.procs = match (proc, threads) {
        (Some(p), Some(t)) => Some((p, t)),
        (None, None) => None,
        _ => return Err("--proc and --threads go together".into()),
    };
    if (a.out.is_none() && a.procs.is_none()) || a.rate <= 0.0 {
        return Err("--out FILE or --proc FILE is required, and --rate must be positive".into());
    }
    Ok(a)
}

enum Watch {
    Stacks(i32, String),
    Proc(i32),
    /// every thread read now, then "read" said on stdout
    ReadAll,
}

/// The processes named on stdin, each also counted on `wake` (an eventfd) to end a wait.
fn read_pids(wake: libc::c_int) -> Receiver<Watch> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let (first, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let watch = match (first, first.parse()) {
                ("proc", _) => rest.trim().parse().map(Watch::Proc).ok(),
                ("read", _) => Some(Watch::ReadAll),
                (_, Ok(pid)) => Some(Watch::Stacks(pid, rest.to_string())),
                _ => None,
            };
            if let Some(w) = watch {
                let _ = tx.send(w);
                unsafe { libc::eventfd_write(wake, 1) };
            }
        }
    });
    rx
}

/// Sleeps for `d` at most (None: until woken): a line on stdin (counted on `wake`) or a signal
/// ends it.
fn nap(wake: libc::c_int, d: Option<Duration>) {
    let mut fd = libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 };
    let ts = d.map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ });
    let at = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    if unsafe { libc::ppoll(&mut fd, 1, at, std::ptr::null()) } > 0 {
        let mut count = 0u64;
        unsafe { libc::eventfd_read(wake, &mut count) };
    }
}

/// One sampled process: py-spy attached to it (it finds the interpreter and
/// names threads), and our reader when the interpreter is one it knows.
struct Target {
    pid: i32,
    spy: PythonSpy,
    fast: Option<Reader>,
    /// which reader reads it, and why, for the capture's `A` line
    reader: String,
    /// by Python thread identifier, ready for the capture, with the native id of the thread named
    /// (an identifier is a pthread_t: a thread started after another ended often gets its one)
    names: HashMap<u64, (u64, String)>,
    /// when names were last asked for, and how long to wait before asking again for an unnamed thread
    named_at: (Instant, Duration),
    /// with ticks: its threads off a CPU are yet to be read (it has just been attached)
    unread: bool,
    /// with ticks: which of its threads BPF copies the stacks of, and which it drops
    in_bpf: InBpf,
    /// its CPU clock before its last read (polled, or of the threads off a CPU), and that read's samples
    last: Option<(u64, Vec<ThreadSample>)>,
}

impl Target {
    fn attach(pid: i32, config: &Config, pyspy_only: bool) -> Result<Target, String> {
        let mut spy = PythonSpy::retry_new(pid as py_spy::Pid, config, 20).map_err(|e| format!("{e}"))?;
        let ours = !pyspy_only && !config.native && cfg!(target_arch = "x86_64") && spy.version.major == 3;
        let (fast, reader) = match ours.then(|| our_reader(pid, &mut spy)) {
            Some(Ok(r)) => {
                let name = r.name().to_string();
                (Some(r), name)
            }
            Some(Err(why)) => (None, format!("py-spy ({why})")),
            None => (None, "py-spy".into()),
        };
        Ok(Target { pid, spy, fast, reader, names: HashMap::new(), named_at: (Instant::now(), NAME_RETRY.0),
                    unread: true, in_bpf: InBpf::default(), last: None })
    }

    /// Appends to `samples` the threads `how` asks for (py-spy's reader reads them all, and keeps
    /// only the ticked ones on a tick); false when the process could not be read.
    fn read(&mut self, frames: &mut Frames, out: &mut impl Write, samples: &mut Vec<ThreadSample>, how: Read) -> bool {
        if let Some(r) = self.fast.as_mut() {
            // Memory read while the target runs can be torn into any bytes; a bug
            // that lets them through costs one sample (logged), not the run's sampling.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.sample(frames, out, samples, how)));
            return read.unwrap_or(false);
        }
        let Ok(traces) = self.spy.get_stack_traces() else { return false };
        for tr in traces {
            let tid = tr.os_thread_id.unwrap_or(tr.thread_id);
            let ticks = match how {
                Read::Ticked(tids) => tids.iter().filter(|&&t| t == tid).count(),
                _ => 1,
            };
            let ids: Vec<String> = tr.frames.iter()
                .map(|f| frames.id(out, &f.name, &f.filename, f.line).to_string()).collect();
            if self.names.get(&tr.thread_id).is_some_and(|n| n.0 != tid) {
                // py-spy keeps names by identifier: the next read asks for them again
                self.spy.python_thread_names.clear();
            }
            self.names.insert(tr.thread_id, (tid, clean(&tr.thread_name.unwrap_or_default())));
            let s = ThreadSample { tid, ident: tr.thread_id, active: tr.active, owns_gil: tr.owns_gil,
                                   frame_ids: Rc::from(ids.join(",")), stale: false, tick: matches!(how, Read::Ticked(_)) };
            samples.extend(std::iter::repeat_n(s, ticks));
        }
        true
    }

    /// Thread names come from threading's table, read by our reader (names.rs): asked again
    /// when a thread we have not seen appears (a new identifier, or a known one
    /// on another native thread), and while one is unnamed (a thread runs a
    /// little before threading registers its name; some never are) after
    /// NAME_RETRY's first wait, doubled at each miss up to its second. Where
    /// ours cannot read the table, py-spy's reads it.
    fn name_threads(&mut self, samples: &[ThreadSample]) {
        let Some(r) = self.fast.as_mut() else {
            return; // py-spy's own reads name the threads (Target::read)
        };
        let new = samples.iter().any(|s| self.names.get(&s.ident).is_none_or(|n| n.0 != s.tid));
        let unnamed = samples.iter().any(|s| self.names.get(&s.ident).is_some_and(|n| n.1.is_empty()));
        if !new && !(unnamed && self.named_at.0.elapsed() >= self.named_at.1) {
            return;
        }
        let wait = if new { NAME_RETRY.0 } else { (self.named_at.1 * 2).min(NAME_RETRY.1) };
        self.named_at = (Instant::now(), wait);
        let mut named = r.thread_names().unwrap_or_else(|| {
            self.spy.python_thread_names.clear(); // its cache, by identifier, would give an ended thread's name
            self.spy.get_stack_traces().unwrap_or_default().into_iter()
                .map(|tr| (tr.thread_id, tr.thread_name.unwrap_or_default())).collect()
        });
        for s in samples {
            self.names.insert(s.ident, (s.tid, clean(&named.remove(&s.ident).unwrap_or_default())));
        }
    }
}

const AGREE_TRIES: usize = 6;

/// Our reader for this interpreter, if we have one and it agrees with py-spy.
fn our_reader(pid: i32, spy: &mut PythonSpy) -> Result<Reader, String> {
    let minor = spy.version.minor;
    let layout = layout::select(minor, debug_offsets(pid, spy).as_deref())?;
    let a = &spy.addresses;
    let mut r = Reader::new(pid, layout, a.interpreter_address, a.threadstate_address, a.imports_modules_address)
        .map_err(|e| format!("our CPython 3.{minor} reader: {e}"))?;
    // A thread starting or ending between the two reads can spoil one check; on a busy machine a
    // start takes longer than three checks in a row (the interpreter starting its threads): 50 ms apart.
    if (0..AGREE_TRIES).any(|i| {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        agrees(&mut r, spy)
    }) {
        Ok(r)
    } else {
        Err(format!("our CPython 3.{minor} reader disagreed with it on this interpreter"))
    }
}

/// The start of _PyRuntime, where 3.13 keeps its _Py_DebugOffsets: found by
/// symbol, or by the section CPython puts it in for debuggers.
fn debug_offsets(pid: i32, spy: &PythonSpy) -> Option<Vec<u8>> {
    if spy.version.minor < 13 {
        return None;
    }
    let info = PythonProcessInfo::new(&spy.process).ok()?;
    let addr = info.get_symbol("_PyRuntime").copied().or_else(|| {
        [&info.libpython_binary, &info.python_binary].into_iter().flatten()
            .map(|b| b.pyruntime_addr).find(|&a| a != 0)
    })?;
    let mut b = vec![0u8; layout::DEBUG_OFFSETS_LEN];
    Remote::new(pid).read(addr as usize, &mut b).then_some(b)
}

/// Our reader is used only where it reads what py-spy reads: the outermost
/// function of every thread both see, and at least one such thread; and the
/// name of every thread both name. (Not every thread py-spy names: attached as
/// an interpreter starts, ours can find sys.modules unreadable, or threading
/// not there yet, a moment after py-spy read them; the tests check our names.)
fn agrees(r: &mut Reader, spy: &mut PythonSpy) -> bool {
    let ours = r.outermost_functions();
    spy.python_thread_names.clear(); // its cache, by identifier, may hold an ended thread's name
    let Ok(traces) = spy.get_stack_traces() else { return false };
    let names = r.thread_names().unwrap_or_default();
    let mut same = 0;
    for tr in traces {
        if tr.thread_name.as_ref().zip(names.get(&tr.thread_id)).is_some_and(|(theirs, ours)| theirs != ours) {
            return false;
        }
        let Some(outermost) = tr.frames.last() else { continue };
        match ours.get(&tr.thread_id) {
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
    /// reused for every read
    samples: Vec<ThreadSample>,
    /// the last read took too long to be placed in time, and was dropped
    dropped: bool,
    /// polling: the mean interval between reads now (pace.rs)
    poll_ns: u64,
    /// reads due (polled, or of the threads off a CPU) whose process's CPU clock was read, and of them
    /// those repeated (it had not run since): logged at the end
    reads: (u64, u64),
}

impl Sampler<BufWriter<Box<dyn Write>>> {
    /// Writes what is buffered; after a failed write (a full disk) it writes no more.
    fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            capture_stopped("--out", &e);
            self.out = BufWriter::new(Box::new(std::io::sink()));
        }
    }
}

/// Says that a capture is no longer written, and why: in the log, and on stdout, which daskprobe
/// reads as the sampler ends (the log may be on the disk that is full).
fn capture_stopped(what: &str, e: &std::io::Error) {
    log!("writing {what}: {e}: capture stopped");
    let _ = writeln!(std::io::stdout(), "capture stopped: writing {what}: {e}");
}

impl<W: Write> Sampler<W> {
    /// One round's reads of a process (see the top of this file); false when it is gone.
    /// `due`: polling, the time to read; with ticks, to read the threads off a CPU.
    fn round(&mut self, t: &mut Target, ticked: &[Tick], copied: &[Copied], due: bool, ticking: bool) -> bool {
        if !ticking {
            return !due || self.sample(t, Read::All(Duration::from_nanos(self.poll_ns)), &[]);
        }
        self.copied(t, copied);
        let mine: Vec<Tick> = ticked.iter().filter(|k| k.pid == t.pid).copied().collect();
        let tids: Vec<u64> = mine.iter().map(|k| k.tid).collect();
        if !tids.is_empty() && !self.sample(t, Read::Ticked(&tids), &mine) {
            return false;
        }
        if due || t.unread {
            t.unread = false;
            return self.sample(t, Read::OffCpu, &[]);
        }
        true
    }

    /// The stacks BPF copied at the process's ticks, each stamped with its tick's time; one it cannot
    /// use is dropped as an L line of read_ns 0 (read now, it would say what the thread does now).
    fn copied(&mut self, t: &mut Target, copied: &[Copied]) {
        let mine: Vec<&Copied> = copied.iter().filter(|c| c.pid == t.pid).collect();
        let Some(r) = t.fast.as_mut().filter(|_| !mine.is_empty()) else { return };
        let records: Vec<&[u8]> = mine.iter().map(|c| &c.record[..]).collect();
        // torn bytes cost the drain's samples (see Target::read)
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.copied(&records, &mut self.frames, &mut self.out)
        })).unwrap_or_else(|_| vec![None; mine.len()]);
        self.samples.clear();
        let mut at = Vec::new();
        for (c, s) in mine.iter().zip(read) {
            match s {
                Some(s) => {
                    self.samples.push(s);
                    at.push((c.time, c.period));
                }
                None => lines::dropped(&mut self.out, c.time, t.pid, 0),
            }
        }
        t.name_threads(&self.samples);
        for (s, (at, period)) in self.samples.iter().zip(at) {
            lines::sample(&mut self.out, at, t.pid, s, &t.names[&s.ident].1, period);
        }
    }

    /// One read of one process, `ticks` the ticks it reads; false when the process is gone.
    fn sample(&mut self, t: &mut Target, how: Read, ticks: &[Tick]) -> bool {
        let t0 = now_ns();
        self.samples.clear();
        // polling: the mean interval the reads stand for
        let every = match how {
            Read::All(every) => Some(every.as_nanos() as u64),
            _ => None,
        };
        // Polling, and with ticks for the threads off a CPU (every OFF_CPU_EVERY, idle processes too).
        let cpu = matches!(how, Read::All(_) | Read::OffCpu).then(|| procs::cpu_ns(t.pid)).flatten();
        self.reads.0 += cpu.is_some() as u64;
        if let Some(last) = t.last.as_ref().filter(|(was, _)| Some(*was) == cpu).map(|l| &l.1) {
            // Nothing in it ran since its last read, which no stale stack made uncertain: each
            // thread is where that read found it (one waiting for a CPU still waits).
            self.reads.1 += 1;
            for s in last {
                lines::sample(&mut self.out, t0, t.pid, s, &t.names[&s.ident].1, every.unwrap_or(0));
            }
            return true;
        }
        let read = t.read(&mut self.frames, &mut self.out, &mut self.samples, how);
        let took = now_ns() - t0;
        let at = t0 + took / 2;
        let pid = t.pid;
        self.dropped = read && took > MAX_READ_NS;
        match read {
            // A read that took longer than 2 ms cannot be placed within 1 ms: drop it.
            true if took > MAX_READ_NS => {
                lines::dropped(&mut self.out, at, pid, took);
                true
            }
            true => {
                t.name_threads(&self.samples);
                let mut ticks = ticks.to_vec();
                for s in &self.samples {
                    // a thread's samples on ticks are one per tick of it: each stands for its tick's period
                    let k = s.tick.then(|| ticks.iter().position(|k| k.tid == s.tid)).flatten();
                    let period = k.map_or(every.unwrap_or(0), |k| ticks.swap_remove(k).period);
                    lines::sample(&mut self.out, at, pid, s, &t.names[&s.ident].1, period);
                }
                let sure = !self.samples.iter().any(|s| s.stale);
                t.last = cpu.filter(|_| sure).map(|c| (c, self.samples.clone()));
                true
            }
            false => {
                // a failed read of a live process is a lost sample, not the end
                let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
                if !alive {
                    lines::failed(&mut self.out, at, pid, "process exited"); // EXITED in probes/pyspy.py
                }
                alive
            }
        }
    }
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        log!("{e}");
        std::process::exit(2);
    });
    // py-spy opens the binaries a process maps as the mapping itself, checked: never by the path
    let _ = py_spy::binary_parser::OPEN_MAPPED.set(mapped::open_mapped);
    let mut config = Config::default();
    config.native = args.native;
    // Pausing the target costs it time; read its memory while it runs unless
    // native stacks are wanted (they need the pause).
    config.blocking = if args.native { LockingStrategy::Lock } else { LockingStrategy::NonBlocking };
    let out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(procs::append(path).expect("cannot open --out")),
        None => Box::new(std::io::sink()), // no stacks asked for: nothing is written there
    };
    let mut procs = args.procs.as_ref()
        .map(|(p, t)| procs::Procs::open(p, t).expect("cannot open --proc or --threads"));
    let mut s = Sampler { out: BufWriter::with_capacity(1 << 20, out), frames: Frames::default(), samples: Vec::new(),
                           dropped: false, poll_ns: 0, reads: (0, 0) };
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    let new_pids = read_pids(wake);
    let mut ticks = (args.out.is_some() && !args.poll).then(|| Ticks::open(args.rate, wake, OFF_CPU_EVERY))
        .and_then(|t| {
            t.map_err(|e| log!("no CPU ticks ({e}): every thread is read {} times a second",
                                    args.rate)).ok()
        });
    let mut targets: Vec<Target> = Vec::new();
    let (mut ticked, mut copied) = (Vec::new(), Vec::new());
    let mut pace = Pace::new(args.rate, args.fixed);
    let mut next = Instant::now();
    let mut flushed = next;
    let mut timer = false;
    stop_on_signals();
    println!("ready");
    loop {
        // /proc's first: an attach can take a few hundred ms (py-spy retries a process that is starting),
        // and /proc is read on time between them
        let (proc_watches, stack_watches): (Vec<_>, Vec<_>) =
            new_pids.try_iter().partition(|w| matches!(w, Watch::Proc(_)));
        let mut asked = false;
        for w in proc_watches.into_iter().chain(stack_watches) {
            let (pid, name) = match w {
                Watch::ReadAll => {
                    asked = true;
                    continue;
                }
                Watch::Proc(pid) => {
                    procs.as_mut().map_or_else(|| log!("no --proc: {pid} not read"),
                                               |p| p.watch(pid));
                    continue;
                }
                Watch::Stacks(_, _) if args.out.is_none() => continue, // no --out: no stacks
                Watch::Stacks(pid, name) => (pid, name),
            };
            if let Some(p) = procs.as_mut() {
                p.maybe();
            }
            match Target::attach(pid, &config, args.pyspy_only) {
                Ok(t) => {
                    if let Some(ticks) = &ticks {
                        ticks.watch(pid, t.fast.as_ref().map(|r| r.bpf_walk()).unwrap_or_default());
                    }
                    lines::attached(&mut s.out, now_ns(), pid, &name, &t.reader);
                    targets.push(t);
                }
                Err(e) => {
                    lines::failed(&mut s.out, now_ns(), pid, &format!("{name}: {e}"));
                }
            }
        }
        let polled = ticks.is_none() && Instant::now() >= next;
        if let Some(t) = ticks.as_mut() {
            t.drain(&mut ticked, &mut copied);
        }
        let mut gone = Vec::new();
        s.poll_ns = pace.interval_ns();
        targets.retain_mut(|t| {
            s.dropped = false;
            let mut alive = s.round(t, &ticked, &copied, polled || timer || asked, ticks.is_some());
            // the last read may be the only one of a thread started since the one before: one too slow
            // to place is made again
            for _ in 0..LAST_READ_TRIES {
                if !(asked && alive && s.dropped) {
                    break;
                }
                alive = s.round(t, &[], &[], true, ticks.is_some());
            }
            if let (Some(ticks), Some(r)) = (&ticks, &t.fast) {
                // py-spy's processes have none: BPF passes every tick of theirs
                t.in_bpf.update(ticks, t.pid, alive.then(|| r.listed().collect()), &ticked);
            }
            if !alive {
                gone.push(t.pid);
            }
            alive
        });
        if polled {
            pace.read(targets.iter().map(|t| t.pid));
        }
        // a pid reused by a process attached since is its own
        for pid in gone.into_iter().filter(|pid| !targets.iter().any(|t| t.pid == *pid)) {
            if let Some(ticks) = &ticks {
                ticks.unwatch(pid);
            }
        }
        if let Some(p) = procs.as_mut() {
            p.maybe();
        }
        if asked {
            s.flush();
            let _ = writeln!(std::io::stdout(), "read"); // a line: stdout flushes it
        }
        if STOP.load(Ordering::Relaxed) {
            s.flush();
            log!("{} reads due, {} of them the last read repeated (its process had not run since)", s.reads.0, s.reads.1);
            if let Some(p) = procs.as_mut() {
                p.finish();
            }
            std::process::exit(0);
        }
        if flushed.elapsed() >= FLUSH_EVERY {
            s.flush();
            flushed = Instant::now();
        }
        timer = match ticks.as_mut() {
            Some(t) => t.wait(),
            None => {
                let now = Instant::now();
                if polled {
                    next = (next + pace.next()).max(now); // fell behind: skip, don't burst
                }
                let poll = args.out.is_some().then(|| next.saturating_duration_since(now));
                let read = procs.as_ref().map(|p| p.due_in());
                nap(wake, poll.into_iter().chain(read).min());
                false
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// Threads named in the shapes real code names them: by the constructor, by a subclass, after
    /// starting, with characters of one, two and four bytes, one whose instance dict was asked for.
    const NAMED: &str = r#"
import sys, threading
class Mine(threading.Thread):
    def run(self):
        stop.wait()
stop = threading.Event()
ts = [threading.Thread(target=stop.wait, name="latin-é"), Mine(name="mine"),
      threading.Thread(target=stop.wait, name="wide-線"), threading.Thread(target=stop.wait),
      threading.Thread(target=stop.wait, name="astral-🐍")]
for t in ts:
    t.daemon = True
    t.start()
ts[3].name = "renamed-later"
ts[1].__dict__
threading.current_thread().name = "Main-X"
print(" ".join(f"{t.ident}={t.name}" for t in threading.enumerate()), flush=True)
sys.stdin.readline()
"#;

    /// The newest pyenv CPython 3.`minor`.x, if installed.
    fn pyenv_python(minor: u32) -> Option<std::path::PathBuf> {
        let root: std::path::PathBuf = match std::env::var("PYENV_ROOT") {
            Ok(r) => r.into(),
            Err(_) => std::path::Path::new(&std::env::var("HOME").ok()?).join(".pyenv"),
        };
        let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(root.join("versions")).ok()?
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let patch = name.strip_prefix(&format!("3.{minor}."))?.parse().ok()?;
                Some((patch, root.join("versions").join(&name).join(format!("bin/python3.{minor}"))))
            }).collect();
        found.sort();
        found.pop().map(|f| f.1)
    }

    /// Our reader names every thread as threading.enumerate() does, on each version it reads.
    #[test]
    fn our_reader_names_threads_as_threading_does() {
        if unsafe { libc::geteuid() } != 0 {
            return; // reading another process's memory needs root here
        }
        for minor in 10..=13 {
            let Some(python) = pyenv_python(minor) else {
                eprintln!("CPython 3.{minor} not in pyenv: not checked");
                continue;
            };
            let mut p = Command::new(python).args(["-c", NAMED]).stdin(Stdio::piped()).stdout(Stdio::piped())
                .spawn().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(p.stdout.take().unwrap()).read_line(&mut line).unwrap();
            let t = Target::attach(p.id() as i32, &Config::default(), false);
            let names = t.map(|mut t| (t.reader.clone(), t.fast.as_mut().and_then(|r| r.thread_names())));
            p.kill().unwrap();
            p.wait().unwrap();
            let (reader, names) = names.unwrap();
            assert_eq!(reader, format!("cpython3{minor}"));
            let mut shown: Vec<String> = names.unwrap().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
            shown.sort();
            let mut expected: Vec<String> = line.split_whitespace().map(String::from).collect();
            expected.sort();
            assert_eq!(shown, expected, "3.{minor}");
        }
    }
}
