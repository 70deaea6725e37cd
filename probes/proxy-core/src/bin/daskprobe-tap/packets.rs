//! TCP segments of the watched ports, as the kernel hands them to an AF_PACKET socket
//! (SOCK_DGRAM: from the IP header on), filtered in the kernel by a classic BPF program,
//! each stamped with its kernel receive time on CLOCK_MONOTONIC. They are read from a
//! TPACKET_V3 ring shared with the kernel: no system call per packet, and a wake-up only
//! per block of them (full, or retired after RETIRE_MS).
//!
//! RETIRE_MS bounds how long a packet waits in the kernel, hence how soon the process that
//! opened a connection is looked up (a connection closed by then has none). At 20 ms, waking for
//! each block was a quarter of the tap's CPU while 10 ms tasks ran: 100 ms wakes it a fifth as often.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const SNAP: u32 = 1 << 18; // more than loopback's 64 KiB packets
const BLOCK: u32 = 1 << 20;
const BLOCKS: u32 = 64; // 64 MiB: a burst while the tap is off a CPU waits here instead of being dropped
pub const RETIRE_MS: u32 = 100;
/// Up to this many ports the kernel's filter lists them (8 instructions each: a classic BPF program
/// holds at most 4,096, about 500 ports); past it, it keeps every port between the lowest and the
/// highest, and the segments of the ports between that are not watched are dropped by the reader.
pub const MAX_LISTED: usize = 400;

pub struct Segment<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub syn: bool,
    pub ack: bool,
    pub fin: bool,
    pub rst: bool,
    pub payload: &'a [u8],
}

pub struct Tap {
    fd: i32,
    ring: *mut u8,
    wake: i32,      // an eventfd that ends a wait for packets too (-1: none)
    block: u32,     // the block being read
    left: u32,      // its packets not yet read, 0: none taken from the kernel
    at: usize,      // the next packet's offset in the ring
    lo: i32,        // loopback's ifindex: there each packet passes twice, out and in; the way in is kept
    clocks: Clocks, // the ring's stamps are CLOCK_REALTIME
    dropped: u64,   // packets the kernel dropped for want of room, not yet taken (take_drops)
}

fn check(r: i32) -> io::Result<i32> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn setsockopt<T>(fd: i32, level: i32, name: i32, value: &T) -> io::Result<()> {
    let r = unsafe { libc::setsockopt(fd, level, name, value as *const T as *const _, size_of::<T>() as u32) };
    check(r).map(|_| ())
}

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Which of the watched ports' segments a packet socket keeps.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    /// all but bare ACKs (no data, no SYN, FIN or RST: about half of Dask's segments, and nothing to a
    /// stream put back together)
    Streams,
    /// a connection's first SYN (no ACK), its headers only
    Syns,
}

/// How much of a SYN is kept: the largest IPv4 and TCP headers, with their options.
const SYN_SNAP: u32 = 120;

/// Accepts a TCP segment (IPv4 unfragmented, or IPv6 without extension headers) whose source
/// or destination port is watched, and that `keep` keeps; drops every other packet in the kernel,
/// uncopied, and on loopback (ifindex `lo`) the copy of each packet on its way out.
fn filter(ports: &[u16], lo: i32, keep: Keep) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_B, BPF_H, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_LDX, BPF_MSH,
               BPF_RET, BPF_RSH, BPF_ALU};
    let (ld_b, ld_h, ld_ind) = ((BPF_LD | BPF_B | BPF_ABS) as u16, (BPF_LD | BPF_H | BPF_ABS) as u16,
                                (BPF_LD | BPF_H | BPF_IND) as u16);
    let (jeq, ret, ja) = ((BPF_JMP | BPF_JEQ | BPF_K) as u16, (BPF_RET | BPF_K) as u16, (BPF_JMP | BPF_JA) as u16);
    let jset = (BPF_JMP | BPF_JSET | BPF_K) as u16;
    let (jge, jgt) = ((BPF_JMP | libc::BPF_JGE | BPF_K) as u16, (BPF_JMP | libc::BPF_JGT | BPF_K) as u16);
    let (lowest, highest) = (ports.iter().min().copied().unwrap_or(0), ports.iter().max().copied().unwrap_or(0));
    // a watched port jumps to the block's end, which tells a bare ACK (long jumps: ja's offset is 32 bits)
    let ports_then = |v: &mut Vec<libc::sock_filter>, load: libc::sock_filter| {
        v.push(load);
        if ports.len() > MAX_LISTED {
            v.push(op(jge, 0, 2, lowest as u32));
            v.push(op(jgt, 1, 0, highest as u32));
            v.push(op(ja, 0, 0, u32::MAX));
            return;
        }
        for &p in ports {
            v.push(op(jeq, 0, 1, p as u32));
            v.push(op(ja, 0, 0, u32::MAX)); // to the block's end: patched below
        }
    };
    let to_end = |mut v: Vec<libc::sock_filter>, end: &[libc::sock_filter]| {
        let at = v.len() as u32;
        for (i, o) in v.iter_mut().enumerate().filter(|(_, o)| o.code == ja && o.k == u32::MAX) {
            o.k = at - i as u32 - 1;
        }
        v.extend_from_slice(end);
        v
    };
    // Given the TCP header's offset in X (v4) or at 40 (v6), and the IP payload's length in A...
    let (ldx_ind_b, ld_mem, st_mem, tax) = ((BPF_LD | BPF_B | BPF_IND) as u16, (BPF_LD | libc::BPF_MEM) as u16,
                                            libc::BPF_ST as u16, (libc::BPF_MISC | libc::BPF_TAX) as u16);
    let (and, rsh, sub_x) = ((BPF_ALU | libc::BPF_AND | BPF_K) as u16, (BPF_ALU | BPF_RSH | BPF_K) as u16,
                             (BPF_ALU | libc::BPF_SUB | libc::BPF_X) as u16);
    let kept = |flags: libc::sock_filter, offset: libc::sock_filter, length: Vec<libc::sock_filter>| {
        if keep == Keep::Syns {
            return vec![flags, op(and, 0, 0, 0x12), op(jeq, 0, 1, 0x02), op(ret, 0, 0, SYN_SNAP), op(ret, 0, 0, 0)];
        }
        let mut v = vec![flags, op(jset, 0, 1, 0x07), op(ret, 0, 0, SNAP)]; // FIN, SYN or RST: kept
        v.extend(length); // A: the TCP header and data's length
        v.extend([op(st_mem, 0, 0, 0), offset, op(and, 0, 0, 0xf0), op(rsh, 0, 0, 2), op(tax, 0, 0, 0),
                  op(ld_mem, 0, 0, 0), op(sub_x, 0, 0, 0), op(jeq, 0, 1, 0), op(ret, 0, 0, 0), op(ret, 0, 0, SNAP)]);
        v
    };
    let mut v4 = vec![op(ld_b, 0, 0, 9), op(jeq, 1, 0, 6), op(ret, 0, 0, 0), op(ld_h, 0, 0, 6),
                      op(jset, 0, 1, 0x1fff), op(ret, 0, 0, 0),
                      op((BPF_LDX | BPF_B | BPF_MSH) as u16, 0, 0, 0)];
    ports_then(&mut v4, op(ld_ind, 0, 0, 0));
    ports_then(&mut v4, op(ld_ind, 0, 0, 2));
    v4.push(op(ret, 0, 0, 0));
    // v4: the IP total length less the IP header's (X)
    let v4 = to_end(v4, &kept(op(ldx_ind_b, 0, 0, 13), op(ldx_ind_b, 0, 0, 12),
                                          vec![op(ld_h, 0, 0, 2), op(sub_x, 0, 0, 0)]));
    let mut v6 = vec![op(ld_b, 0, 0, 6), op(jeq, 1, 0, 6), op(ret, 0, 0, 0)];
    ports_then(&mut v6, op(ld_h, 0, 0, 40));
    ports_then(&mut v6, op(ld_h, 0, 0, 42));
    v6.push(op(ret, 0, 0, 0));
    let v6 = to_end(v6, &kept(op(ld_b, 0, 0, 53), op(ld_b, 0, 0, 52), vec![op(ld_h, 0, 0, 4)]));
    let ancillary = |what: i32| op((BPF_LD | libc::BPF_W | BPF_ABS) as u16, 0, 0, (libc::SKF_AD_OFF + what) as u32);
    let mut prog = vec![ancillary(libc::SKF_AD_IFINDEX), op(jeq, 0, 3, lo as u32), ancillary(libc::SKF_AD_PKTTYPE),
                        op(jeq, 0, 1, libc::PACKET_OUTGOING as u32), op(ret, 0, 0, 0)];
    // the IP version, then a long jump (ja's offset is 32 bits) to its block
    prog.extend([op(ld_b, 0, 0, 0), op((BPF_ALU | BPF_RSH | BPF_K) as u16, 0, 0, 4),
                 op(jeq, 0, 1, 4), op(ja, 0, 0, 3), op(jeq, 0, 1, 6), op(ja, 0, 0, 1 + v4.len() as u32),
                 op(ret, 0, 0, 0)]);
    prog.extend(v4);
    prog.extend(v6);
    prog
}

fn attach_filter(fd: i32, ports: &[u16], lo: i32, keep: Keep) -> io::Result<()> {
    let prog = filter(ports, lo, keep);
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut _ };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog).map_err(|e| {
        io::Error::new(e.kind(), format!("the kernel refused a packet filter of {} instructions for {} ports: {e}",
                                         prog.len(), ports.len()))
    })
}

/// What failed, and the error: the socket alone needs root (or CAP_NET_RAW).
fn step(what: &str) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| {
        let needs = matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES));
        io::Error::new(e.kind(), format!("{what}: {e}{}", if needs { " (it needs root or CAP_NET_RAW)" } else { "" }))
    }
}

/// Which interfaces' packets the tap is handed.
#[derive(Clone, Copy, PartialEq)]
pub enum Interfaces {
    All,
    /// Loopback's alone, each packet once, on its way in: enough when every process of the cluster
    /// runs on this host (their packets all pass loopback, whatever address they use). The kernel then
    /// neither clones each packet on its way out to run the filters on it, nor shows the tap another
    /// interface's. A small message's round trip over loopback cost 0.6 µs more with the tap, against
    /// 1.2 µs on every interface (1.6 against 2.2 µs on a watched port; docs/measurements.md, 2026-11-29).
    Loopback,
}

/// SOL_PACKET's option (Linux 4.20) that hands a socket no outgoing packet
const PACKET_IGNORE_OUTGOING: i32 = 23;

/// A packet socket keeping what `keep` keeps of the watched ports' segments, and loopback's ifindex.
/// It is opened for no protocol, so no packet reaches it before the filter is in place; `bind` then
/// starts the packets coming.
fn packet_socket(ports: &[u16], keep: Keep, on: Interfaces) -> io::Result<(i32, i32)> {
    let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
        .map_err(step("cannot open a packet socket"))?;
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
    if lo == 0 && on == Interfaces::Loopback {
        unsafe { libc::close(fd) };
        return Err(io::Error::new(io::ErrorKind::NotFound, "no loopback interface (lo) to capture on"));
    }
    attach_filter(fd, ports, lo, keep).inspect_err(|_| unsafe { libc::close(fd); })?;
    if on == Interfaces::Loopback {
        // older kernels refuse it: the filter drops loopback's outgoing packets itself then
        let _ = setsockopt(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32);
    }
    Ok((fd, lo))
}

/// Packets of every protocol from now on, of loopback alone or of every interface.
fn bind(fd: i32, lo: i32, on: Interfaces) -> io::Result<()> {
    let mut at: libc::sockaddr_ll = unsafe { zeroed() };
    at.sll_family = libc::AF_PACKET as u16;
    at.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    at.sll_ifindex = if on == Interfaces::Loopback { lo } else { 0 };
    let r = unsafe { libc::bind(fd, &at as *const _ as *const libc::sockaddr, size_of::<libc::sockaddr_ll>() as u32) };
    check(r).map(drop).map_err(step("cannot bind the packet socket"))
}

/// The SYNs opening connections to the watched ports, each read as it comes (a system call each:
/// they are few), so that their openers are looked up before a short connection has closed.
pub struct Syns {
    fd: i32,
    lo: i32,
}

impl Syns {
    pub fn open(ports: &[u16], on: Interfaces) -> io::Result<Syns> {
        let (fd, lo) = packet_socket(ports, Keep::Syns, on)?;
        bind(fd, lo, on).inspect_err(|_| unsafe { libc::close(fd); })?; // the tap goes on without it
        Ok(Syns { fd, lo })
    }

    /// As Tap::watch.
    pub fn watch(&self, ports: &[u16]) -> io::Result<()> {
        attach_filter(self.fd, ports, self.lo, Keep::Syns)
    }

    /// The next SYN's (source, destination), waiting for it.
    pub fn next(&self) -> io::Result<(SocketAddr, SocketAddr)> {
        let mut buf = [0u8; SYN_SNAP as usize];
        loop {
            let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if let Some(s) = parse(&buf[..n as usize]) {
                return Ok((s.src, s.dst));
            }
        }
    }
}

impl Tap {
    pub fn open(ports: &[u16], on: Interfaces) -> io::Result<Tap> {
        let (fd, lo) = packet_socket(ports, Keep::Streams, on)?;
        setsockopt(fd, libc::SOL_PACKET, libc::PACKET_VERSION, &(libc::tpacket_versions::TPACKET_V3 as i32))
            .map_err(step("cannot use TPACKET_V3"))?;
        let req = libc::tpacket_req3 {
            tp_block_size: BLOCK, tp_block_nr: BLOCKS, tp_frame_size: 2048, tp_frame_nr: BLOCK / 2048 * BLOCKS,
            tp_retire_blk_tov: RETIRE_MS, tp_sizeof_priv: 0, tp_feature_req_word: 0,
        };
        setsockopt(fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req).map_err(step("cannot set up the packet ring"))?;
        let size = (BLOCK * BLOCKS) as usize;
        let ring = unsafe {
            libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if ring == libc::MAP_FAILED {
            return Err(step("cannot map the packet ring")(io::Error::last_os_error()));
        }
        bind(fd, lo, on)?;
        Ok(Tap { fd, wake: -1, ring: ring as *mut u8, block: 0, left: 0, at: 0, lo, clocks: Clocks::default(),
                 dropped: 0 })
    }

    /// Packets the kernel dropped for want of room in the ring since the last call. Counted as each
    /// block is taken: a packet dropped before a segment of that block was, so the gap it leaves
    /// is known to be lost by the time the segment after it is read.
    pub fn take_drops(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// Counts the drops now, not at the next block (the end of the run).
    pub fn count_drops(&mut self) {
        self.dropped += self.drops() as u64;
    }

    /// Watches these ports from now on (a member that joined while recording): the kernel
    /// swaps the filter in place, and packets already in the ring stay.
    pub fn watch(&self, ports: &[u16]) -> io::Result<()> {
        attach_filter(self.fd, ports, self.lo, Keep::Streams)
    }

    /// From now on a write to `fd`, an eventfd, ends a wait in `next` (news from another thread).
    pub fn wake_on(&mut self, fd: i32) {
        self.wake = fd;
    }

    fn desc(&self) -> *mut libc::tpacket_block_desc {
        unsafe { self.ring.add((self.block * BLOCK) as usize) as *mut libc::tpacket_block_desc }
    }

    /// The next watched segment and its time, or None when `timeout_ms` (-1: no limit) passed without
    /// one or the wake-up fd was written.
    pub fn next(&mut self, timeout_ms: i32) -> io::Result<Option<(u64, Segment<'_>)>> {
        loop {
            while self.left == 0 {
                if !self.take_block(timeout_ms)? {
                    return Ok(None);
                }
            }
            let hdr = unsafe { &*(self.ring.add(self.at) as *const libc::tpacket3_hdr) };
            let ll = unsafe {
                &*(self.ring.add(self.at + align(size_of::<libc::tpacket3_hdr>())) as *const libc::sockaddr_ll)
            };
            let data = unsafe {
                std::slice::from_raw_parts(self.ring.add(self.at + hdr.tp_net as usize), hdr.tp_snaplen as usize)
            };
            let time = libc::timespec { tv_sec: hdr.tp_sec as _, tv_nsec: hdr.tp_nsec as _ };
            let (outgoing_lo, next) = (ll.sll_pkttype == libc::PACKET_OUTGOING as u8 && ll.sll_ifindex == self.lo,
                                       hdr.tp_next_offset as usize);
            self.at += next;
            self.left -= 1;
            if !outgoing_lo {
                if let Some(seg) = parse(data) {
                    return Ok(Some((self.clocks.monotonic(time), seg)));
                }
            }
        }
    }

    /// Hands the block read back to the kernel and takes the next one, waiting for it up to
    /// `timeout_ms`; false if it did not come.
    fn take_block(&mut self, timeout_ms: i32) -> io::Result<bool> {
        let status = |t: &Tap| unsafe { std::ptr::read_volatile(&(*t.desc()).hdr.bh1.block_status) };
        if self.at != 0 {
            // the block just read: the kernel's again (after our reads of it)
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            unsafe { std::ptr::write_volatile(&mut (*self.desc()).hdr.bh1.block_status, libc::TP_STATUS_KERNEL) };
            self.block = (self.block + 1) % BLOCKS;
            self.at = 0;
        }
        if status(self) & libc::TP_STATUS_USER == 0 {
            let mut pfd = [libc::pollfd { fd: self.fd, events: libc::POLLIN | libc::POLLERR, revents: 0 },
                           libc::pollfd { fd: self.wake, events: libc::POLLIN, revents: 0 }];
            check(unsafe { libc::poll(pfd.as_mut_ptr(), 2, timeout_ms) })?;
            if pfd[1].revents & libc::POLLIN != 0 {
                // the news first: a block that came meanwhile is taken at the next call
                let mut count = 0u64;
                unsafe { libc::eventfd_read(self.wake, &mut count) };
                return Ok(false);
            }
            if status(self) & libc::TP_STATUS_USER == 0 {
                return Ok(false);
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let bh = unsafe { &(*self.desc()).hdr.bh1 };
        self.left = bh.num_pkts;
        self.at = (self.block * BLOCK + bh.offset_to_first_pkt) as usize;
        self.dropped += self.drops() as u64;
        Ok(true)
    }

    /// Packets the kernel dropped for want of room in the ring, since the last call (reading the
    /// statistics resets them).
    fn drops(&self) -> u32 {
        let mut stats: libc::tpacket_stats_v3 = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as u32;
        let r = unsafe {
            libc::getsockopt(self.fd, libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut stats as *mut _ as *mut _, &mut len)
        };
        if r == 0 { stats.tp_drops } else { 0 }
    }
}

fn align(n: usize) -> usize {
    (n + libc::TPACKET_ALIGNMENT - 1) & !(libc::TPACKET_ALIGNMENT - 1)
}

const CLOCKS_EVERY_NS: i128 = 10_000_000; // how long the clocks' difference is taken as steady
const CLOCK_TRIES: usize = 3;
const MAX_SLEW_PPM: i128 = 500; // the most adjtime lets NTP slew CLOCK_REALTIME

/// The difference of CLOCK_REALTIME (the ring's stamps) and CLOCK_MONOTONIC (the run's clock), read
/// again every CLOCKS_EVERY_NS (NTP's slewing moves it by microseconds a second at most). Each time
/// the best of CLOCK_TRIES brackets is kept: a read of the two clocks that the tap was preempted
/// in the middle of would put every stamp off by that preemption, and a host's clock offset is
/// estimated from the quickest of these stamps.
#[derive(Default)]
struct Clocks {
    real_minus_mono: i128,
    half_width: i128, // of the bracket it came from: its uncertainty then
    measured_at: i128, // monotonic ns of that reading; 0: never read
    read_at: i128,     // of the last reading, kept or not
}

impl Clocks {
    fn monotonic(&mut self, real: libc::timespec) -> u64 {
        let now = ns(libc::CLOCK_MONOTONIC);
        if self.read_at == 0 || now - self.read_at > CLOCKS_EVERY_NS {
            let reads = (0..CLOCK_TRIES).map(|_| (ns(libc::CLOCK_REALTIME), ns(libc::CLOCK_MONOTONIC), ns(libc::CLOCK_REALTIME)));
            let (r0, mono, r1) = reads.min_by_key(|(r0, _, r1)| r1 - r0).unwrap();
            let (estimate, half_width) = ((r0 + r1) / 2 - mono, (r1 - r0) / 2);
            // The kept reading's uncertainty grows as NTP may have slewed since; a new one replaces it
            // when narrower, or when the two cannot both be right (the clock was stepped). A reading
            // the tap was preempted in (all its tries) is wide, and would move every stamp by it.
            let aged = self.half_width + (mono - self.measured_at) * MAX_SLEW_PPM / 1_000_000;
            if self.measured_at == 0 || half_width <= aged || (estimate - self.real_minus_mono).abs() > half_width + aged {
                (self.real_minus_mono, self.half_width, self.measured_at) = (estimate, half_width, mono);
            }
            self.read_at = mono;
        }
        (real.tv_sec as i128 * 1_000_000_000 + real.tv_nsec as i128 - self.real_minus_mono) as u64
    }
}

fn ns(clock: libc::clockid_t) -> i128 {
    let mut ts: libc::timespec = unsafe { zeroed() };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// None for anything but a whole TCP header over IPv4 or IPv6: nothing a packet holds can panic here.
fn parse(p: &[u8]) -> Option<Segment<'_>> {
    let (src_ip, dst_ip, tcp): (IpAddr, IpAddr, &[u8]) = match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let ihl = ((p[0] & 0xf) as usize) * 4;
            let total = (u16::from_be_bytes([p[2], p[3]]) as usize).min(p.len());
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]));
            (ip(12), ip(16), p.get(ihl..total)?)
        }
        6 if p.len() >= 40 => {
            let total = (40 + u16::from_be_bytes([p[4], p[5]]) as usize).min(p.len());
            let ip = |at: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[at..at + 16]).unwrap()));
            (ip(8), ip(24), p.get(40..total)?)
        }
        _ => return None,
    };
    if tcp.len() < 20 {
        return None;
    }
    let off = ((tcp[12] >> 4) as usize) * 4;
    let flags = tcp[13];
    Some(Segment {
        src: SocketAddr::new(src_ip, u16::from_be_bytes([tcp[0], tcp[1]])),
        dst: SocketAddr::new(dst_ip, u16::from_be_bytes([tcp[2], tcp[3]])),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        fin: flags & 1 != 0,
        syn: flags & 2 != 0,
        rst: flags & 4 != 0,
        ack: flags & 16 != 0,
        payload: tcp.get(off..)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP segment from 127.0.0.1:40000 to 127.0.0.1:8786 carrying `payload`.
    fn packet(flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1];
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&8786u16.to_be_bytes());
        p.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend_from_slice(payload);
        let len = (p.len() as u16).to_be_bytes();
        p[2..4].copy_from_slice(&len);
        p
    }

    #[test]
    fn reads_a_segment_and_refuses_every_cut_of_it() {
        let p = packet(0x18, b"hello");
        let s = parse(&p).unwrap();
        assert_eq!((s.src.port(), s.dst.port(), s.seq, s.payload), (40000, 8786, 0x0102_0304, &b"hello"[..]));
        assert!(s.ack && !s.syn && !s.fin && !s.rst);
        for cut in 0..40 {
            assert!(parse(&p[..cut]).is_none(), "a packet cut at {cut} bytes");
        }
    }

    /// Over a real loopback connection, one side writing and the other only reading (so acking):
    /// every byte reaches the tap once, and no bare ACK does, on every interface or loopback alone.
    /// Needs root (CAP_NET_RAW).
    #[test]
    fn the_kernel_keeps_data_syn_and_fin_and_drops_bare_acks() {
        for on in [Interfaces::All, Interfaces::Loopback] {
            let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = server.local_addr().unwrap().port();
            let Ok(mut tap) = Tap::open(&[port], on) else { return }; // not root: nothing to test
            assert_eq!(one_connection(server, &mut tap), (500, 2, 2, 0));
        }
    }

    /// Data, SYNs, FINs and bare ACKs the tap read of one connection, whose client writes 50 times.
    fn one_connection(server: std::net::TcpListener, tap: &mut Tap) -> (usize, usize, usize, usize) {
        use std::io::{Read, Write};
        let mut client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        client.set_nodelay(true).unwrap();
        let (mut conn, _) = server.accept().unwrap();
        let mut buf = [0u8; 100];
        for _ in 0..50 {
            client.write_all(b"0123456789").unwrap();
            conn.read_exact(&mut buf[..10]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2)); // each write its own segment, acked
        }
        drop(client);
        assert_eq!(conn.read(&mut buf).unwrap(), 0);
        drop(conn);
        let (mut data, mut syn, mut fin, mut bare) = (0, 0, 0, 0);
        while let Some((_, seg)) = tap.next(200).unwrap() {
            data += seg.payload.len();
            syn += seg.syn as usize;
            fin += seg.fin as usize;
            bare += (seg.payload.is_empty() && !seg.syn && !seg.fin && !seg.rst) as usize;
        }
        (data, syn, fin, bare)
    }

    /// Each connection's SYN, and nothing else of it (its SYN-ACK, data, FIN), on every interface or
    /// loopback alone. Needs root.
    #[test]
    fn the_syns_socket_keeps_each_connection_s_first_syn_only() {
        use std::io::Write;
        for on in [Interfaces::All, Interfaces::Loopback] {
            let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = server.local_addr().unwrap().port();
            let Ok(syns) = Syns::open(&[port], on) else { return }; // not root: nothing to test
            let limit = libc::timeval { tv_sec: 5, tv_usec: 0 }; // a SYN missed fails, not hangs
            setsockopt(syns.fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &limit).unwrap();
            for _ in 0..2 {
                let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                client.write_all(b"data").unwrap();
                drop(server.accept().unwrap());
                let (src, dst) = syns.next().unwrap();
                assert_eq!((src, dst), (client.local_addr().unwrap(), server.local_addr().unwrap()));
            }
        }
    }
}
