//! TCP segments of the watched ports, as the kernel hands them to an AF_PACKET socket
//! (SOCK_DGRAM: from the IP header on), filtered in the kernel by a classic BPF program,
//! each stamped with its kernel receive time on CLOCK_MONOTONIC.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const SNAP: u32 = 1 << 18; // more than loopback's 64 KiB packets
const RCVBUF: i32 = 64 << 20; // a burst while the tap is off a CPU waits here instead of being dropped

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
    buf: Vec<u8>,
    lo: i32, // loopback's ifindex: there each packet passes twice, out and in; the way in is kept
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

/// Accepts a TCP segment (IPv4 unfragmented, or IPv6 without extension headers) whose source
/// or destination port is watched; drops every other packet in the kernel, uncopied.
fn filter(ports: &[u16]) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_B, BPF_H, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_LDX, BPF_MSH,
               BPF_RET, BPF_RSH, BPF_ALU};
    let (ld_b, ld_h, ld_ind) = ((BPF_LD | BPF_B | BPF_ABS) as u16, (BPF_LD | BPF_H | BPF_ABS) as u16,
                                (BPF_LD | BPF_H | BPF_IND) as u16);
    let (jeq, ret, ja) = ((BPF_JMP | BPF_JEQ | BPF_K) as u16, (BPF_RET | BPF_K) as u16, (BPF_JMP | BPF_JA) as u16);
    let ports_then = |load: Vec<libc::sock_filter>| -> Vec<libc::sock_filter> {
        let mut v = load;
        for &p in ports {
            v.push(op(jeq, 0, 1, p as u32));
            v.push(op(ret, 0, 0, SNAP));
        }
        v
    };
    let mut v4 = vec![op(ld_b, 0, 0, 9), op(jeq, 1, 0, 6), op(ret, 0, 0, 0), op(ld_h, 0, 0, 6),
                      op((BPF_JMP | BPF_JSET | BPF_K) as u16, 0, 1, 0x1fff), op(ret, 0, 0, 0),
                      op((BPF_LDX | BPF_B | BPF_MSH) as u16, 0, 0, 0)];
    v4.extend(ports_then(vec![op(ld_ind, 0, 0, 0)]));
    v4.extend(ports_then(vec![op(ld_ind, 0, 0, 2)]));
    v4.push(op(ret, 0, 0, 0));
    let mut v6 = vec![op(ld_b, 0, 0, 6), op(jeq, 1, 0, 6), op(ret, 0, 0, 0)];
    v6.extend(ports_then(vec![op(ld_h, 0, 0, 40)]));
    v6.extend(ports_then(vec![op(ld_h, 0, 0, 42)]));
    v6.push(op(ret, 0, 0, 0));
    // the IP version, then a long jump (ja's offset is 32 bits) to its block
    let mut prog = vec![op(ld_b, 0, 0, 0), op((BPF_ALU | BPF_RSH | BPF_K) as u16, 0, 0, 4),
                        op(jeq, 0, 1, 4), op(ja, 0, 0, 3), op(jeq, 0, 1, 6), op(ja, 0, 0, 1 + v4.len() as u32),
                        op(ret, 0, 0, 0)];
    prog.extend(v4);
    prog.extend(v6);
    prog
}

impl Tap {
    pub fn open(ports: &[u16]) -> io::Result<Tap> {
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, proto) })?;
        let prog = filter(ports);
        let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut _ };
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)?;
        // root may pass net.core.rmem_max; anyone else gets what the limit allows
        if setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err() {
            setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF)?;
        }
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &1i32)?;
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
        Ok(Tap { fd, buf: vec![0; SNAP as usize], lo })
    }

    /// The next watched segment and its time, or None when `timeout_ms` passed without one.
    pub fn next(&mut self, timeout_ms: i32) -> io::Result<Option<(u64, Segment<'_>)>> {
        loop {
            let Some((n, t)) = self.receive(timeout_ms)? else { return Ok(None) };
            if parse(&self.buf[..n]).is_some() {
                return Ok(Some((t, parse(&self.buf[..n]).unwrap())));
            }
        }
    }

    /// One packet into buf, once in: its length and time.
    fn receive(&mut self, timeout_ms: i32) -> io::Result<Option<(usize, u64)>> {
        loop {
            let mut pfd = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
            if check(unsafe { libc::poll(&mut pfd, 1, timeout_ms) })? == 0 {
                return Ok(None);
            }
            let mut from: libc::sockaddr_ll = unsafe { zeroed() };
            let mut control = [0u64; 16];
            let mut iov = libc::iovec { iov_base: self.buf.as_mut_ptr() as *mut _, iov_len: self.buf.len() };
            let mut msg: libc::msghdr = unsafe { zeroed() };
            msg.msg_name = &mut from as *mut _ as *mut _;
            msg.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut _;
            msg.msg_controllen = size_of::<[u64; 16]>();
            let n = check(unsafe { libc::recvmsg(self.fd, &mut msg, libc::MSG_DONTWAIT) } as i32)?;
            if from.sll_pkttype != libc::PACKET_OUTGOING as u8 || from.sll_ifindex != self.lo {
                return Ok(Some((n as usize, monotonic(received_at(&msg)))));
            }
        }
    }

    /// Packets the kernel dropped for want of room in the socket's buffer, since the last call.
    pub fn drops(&self) -> u32 {
        let mut stats: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as u32;
        let r = unsafe {
            libc::getsockopt(self.fd, libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut stats as *mut _ as *mut _, &mut len)
        };
        if r == 0 { stats.tp_drops } else { 0 }
    }
}

/// The kernel's receive time (SO_TIMESTAMPNS, CLOCK_REALTIME), or now when it gave none.
fn received_at(msg: &libc::msghdr) -> Option<libc::timespec> {
    let mut c = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !c.is_null() {
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_TIMESTAMPNS {
            return Some(unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec) });
        }
        c = unsafe { libc::CMSG_NXTHDR(msg, c) };
    }
    None
}

/// A CLOCK_REALTIME time on CLOCK_MONOTONIC, the run's clock: by their difference read now, two
/// vDSO reads apart (NTP's slewing moves it by microseconds a second at most).
fn monotonic(real: Option<libc::timespec>) -> u64 {
    let ns = |c| {
        let mut ts: libc::timespec = unsafe { zeroed() };
        unsafe { libc::clock_gettime(c, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let (mono, now) = (ns(libc::CLOCK_MONOTONIC), ns(libc::CLOCK_REALTIME));
    match real {
        Some(r) => (r.tv_sec as i128 * 1_000_000_000 + r.tv_nsec as i128 - (now - mono)) as u64,
        None => mono as u64,
    }
}

fn parse(p: &[u8]) -> Option<Segment<'_>> {
    let (src_ip, dst_ip, tcp): (IpAddr, IpAddr, &[u8]) = match p.first()? >> 4 {
        4 => {
            let ihl = ((p[0] & 0xf) as usize) * 4;
            let total = (u16::from_be_bytes([p[2], p[3]]) as usize).min(p.len());
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]));
            (ip(12), ip(16), p.get(ihl..total)?)
        }
        6 => {
            let total = (40 + u16::from_be_bytes([p[4], p[5]]) as usize).min(p.len());
            let ip = |at: usize| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[at..at + 16]).unwrap()));
            (ip(8), ip(24), p.get(40..total)?)
        }
        _ => return None,
    };
    let off = ((*tcp.get(12)? >> 4) as usize) * 4;
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
