//! Which process opened a connection: ask the kernel (netlink sock_diag) for the
//! connecting socket's inode by its exact addresses, then find the process holding
//! that inode. Runs off the forwarding path, once per connection.
//!
//! Reading /proc/net/tcp instead can miss the socket: the kernel writes that table
//! a page per read and resumes by position, so sockets opening and closing
//! meanwhile shift entries past the reader.

use std::collections::HashMap;
use std::fs;
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::record;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const ALL_STATES: u32 = !0;
const NO_COOKIE: u32 = !0;

/// struct inet_diag_sockid (linux/inet_diag.h); ports and addresses in network order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    ifindex: u32,
    cookie: [u32; 2],
}

/// struct nlmsghdr followed by struct inet_diag_req_v2.
#[repr(C)]
struct Request {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// Where struct inet_diag_msg's idiag_uid and idiag_inode sit in a reply: after the 16-byte nlmsghdr,
/// family/state/timer/retrans (4), the sockid, and expires/rqueue/wqueue (12).
const UID_AT: usize = 16 + 4 + size_of::<SockId>() + 12;
const INODE_AT: usize = UID_AT + 4;

fn words(ip: IpAddr) -> [u32; 4] {
    let mut w = [0u32; 4];
    match ip {
        IpAddr::V4(a) => w[0] = u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => {
            for (k, c) in a.octets().chunks(4).enumerate() {
                w[k] = u32::from_ne_bytes(c.try_into().unwrap());
            }
        }
    }
    w
}

/// The kernel's inet_diag_msg for the TCP socket whose own address is `local` and whose peer is `remote`.
fn diag(local: &SocketAddr, remote: &SocketAddr) -> Option<[u8; 512]> {
    let family = if local.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let req = Request {
        len: size_of::<Request>() as u32, kind: SOCK_DIAG_BY_FAMILY, flags: libc::NLM_F_REQUEST as u16,
        seq: 1, pid: 0, family, protocol: libc::IPPROTO_TCP as u8, ext: 0, pad: 0, states: ALL_STATES,
        id: SockId { sport: local.port().to_be(), dport: remote.port().to_be(), src: words(local.ip()),
                     dst: words(remote.ip()), ifindex: 0, cookie: [NO_COOKIE; 2] },
    };
    let mut reply = [0u8; 512];
    // SAFETY: a netlink socket we own and close here; the request and reply buffers outlive the calls.
    let got = unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG);
        if fd < 0 {
            return None;
        }
        let sent = libc::send(fd, &req as *const Request as *const libc::c_void, size_of::<Request>(), 0);
        let got = if sent < 0 { -1 } else { libc::recv(fd, reply.as_mut_ptr() as *mut libc::c_void, reply.len(), 0) };
        libc::close(fd);
        got
    };
    let kind = u16::from_ne_bytes(reply[4..6].try_into().unwrap());
    if got < (INODE_AT + 4) as isize || kind != SOCK_DIAG_BY_FAMILY {
        return None; // NLMSG_ERROR: no such socket (it closed already)
    }
    Some(reply)
}

fn field(reply: &[u8; 512], at: usize) -> u32 {
    u32::from_ne_bytes(reply[at..at + 4].try_into().unwrap())
}

fn socket_inode(local: &SocketAddr, remote: &SocketAddr) -> Option<u32> {
    diag(local, remote).map(|r| field(&r, INODE_AT))
}

/// The uid of the process that opened the connection accepted from `peer` on `ours` (None: the kernel
/// has no such socket here, say one on another host, or closed already).
pub fn opener_uid(peer: &SocketAddr, ours: &SocketAddr) -> Option<u32> {
    diag(peer, ours).map(|r| field(&r, UID_AT))
}

/// Processes found owning connections before, the latest first: the next one is most often theirs
/// (a cluster's few processes open them all), and scanning every process's fds for each was
/// most of the tap's CPU while a session ran.
static OWNERS: Mutex<Vec<i32>> = Mutex::new(Vec::new());
const OWNERS_KEPT: usize = 32;

/// Every socket a scan of a process's fds met, by inode: (its holder then, the fd). A scan reads every fd
/// of the process (a hosting process of 128 workers holds ~700, the scheduler of 1,024 workers ~3,000),
/// so what it read is kept: the lookups of a burst of connections, waiting for one scan of the known
/// owners at a time (SCAN), then mostly find their sockets here. Scanning for each connection anew took
/// the proxy 62 CPU-s of a 54 s run at 1,024 workers (docs/measurements.md, 2026-11-29).
static SEEN: Mutex<Option<HashMap<u32, (i32, u32)>>> = Mutex::new(None);
static SCAN: Mutex<()> = Mutex::new(());
/// More sockets than any run holds at once: past it the cache starts again
const SEEN_KEPT: usize = 1 << 20;

/// Reads every fd of `pid` into SEEN; whether one was `inode`.
fn scan(pid: i32, inode: u32) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    let mut found = false;
    let mut read = Vec::new();
    for fd in fds.flatten() {
        let Some(n) = fd.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(link) = fs::read_link(fd.path()) else { continue };
        let Some(socket) = link.to_str().and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        else { continue };
        found |= socket == inode;
        read.push((socket, n));
    }
    let mut seen = SEEN.lock().unwrap();
    let seen = seen.get_or_insert_with(HashMap::new);
    if seen.len() + read.len() > SEEN_KEPT {
        seen.clear();
    }
    seen.extend(read.into_iter().map(|(socket, n)| (socket, (pid, n))));
    found
}

/// The holder SEEN has for `inode`, if it still holds it at that fd and was not passed over.
fn seen(inode: u32, passed: &[i32]) -> Option<i32> {
    let (pid, fd) = *SEEN.lock().unwrap().as_ref()?.get(&inode)?;
    let link = format!("socket:[{inode}]");
    let still = fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|l| l.as_os_str() == link.as_str());
    (still && !passed.contains(&pid)).then_some(pid)
}

/// The process's parent, from /proc/PID/stat (the field after the state, which follows the name).
fn parent(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Holders of a socket found and gone again before they were named (a child between its fork and
/// its exec, or one that ended) are passed over this many times at most.
const LOOKUPS: usize = 3;

/// The process that opened the socket (see opener); a holder gone before it was named is passed over.
fn owner_of(inode: u32) -> Option<i32> {
    let mut passed = Vec::new();
    for _ in 0..LOOKUPS {
        let pid = holder(inode, &passed)?;
        let Some(pid) = opener(pid, inode) else {
            passed.push(pid);
            continue;
        };
        let mut owners = OWNERS.lock().unwrap();
        owners.retain(|&p| p != pid);
        owners.insert(0, pid);
        owners.truncate(OWNERS_KEPT);
        return Some(pid);
    }
    None
}

/// A process forked after the socket was opened holds it too (a worker's child, or any fork until
/// it execs): the connection is its opener's, the oldest holder up the tree from `pid`. None when
/// the one reached holds it no more: it let it go (exec'd or ended) before its parent was read.
fn opener(mut pid: i32, inode: u32) -> Option<i32> {
    while let Some(up) = parent(pid).filter(|&up| up > 1 && scan(up, inode)) {
        pid = up;
    }
    scan(pid, inode).then_some(pid)
}

/// A process holding socket `inode`, not one of `passed`: where a scan saw it, else scanning the owners
/// found before first, then every other process, the newest first. The walk of every process is made
/// outside SCAN: a lookup whose holder is gone walks it up to LOOKUPS times, and the lookups at SYNs,
/// made before a short connection closes, must not wait for that.
fn holder(inode: u32, passed: &[i32]) -> Option<i32> {
    let known = OWNERS.lock().unwrap().clone();
    let found = {
        let _one_at_a_time = SCAN.lock().unwrap();
        seen(inode, passed).or_else(|| known.iter().copied().filter(|p| !passed.contains(p)).find(|&p| scan(p, inode)))
    };
    found.or_else(|| {
        let mut pids: Vec<i32> = fs::read_dir("/proc").ok()?.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|p| !known.contains(p) && !passed.contains(p)).collect();
        pids.sort_unstable_by(|a, b| b.cmp(a)); // the newest first, as a cluster's processes most often are
        pids.into_iter().find(|&p| scan(p, inode))
    })
}

/// `peer` is the connecting side's address, `ours` the accepted socket's local one.
fn pid_of(peer: &SocketAddr, ours: &SocketAddr) -> Option<i32> {
    owner_of(socket_inode(peer, ours)?)
}

/// The connection's peer record, its pid from `lookup` (-1: not found), sent from a thread of its own:
/// the lookup reads every process's fds, and the forwarding or packet loop must not wait for it.
/// Without a thread for it the pid stays unknown, as when it is not found.
fn send_from_thread(conn: u32, tx: Sender<Vec<u8>>, lookup: impl FnOnce() -> i32 + Send + 'static) {
    let _ = thread::Builder::new().name(format!("c{conn}-peer-pid")).spawn(move || {
        let _ = tx.send(record::peer(conn, lookup()));
    });
}

/// The connection's peer record, looked up now.
pub fn record_pid_of(conn: u32, peer: SocketAddr, ours: SocketAddr, tx: Sender<Vec<u8>>) {
    send_from_thread(conn, tx, move || pid_of(&peer, &ours).unwrap_or(-1));
}

/// How long a connection's record waits for its SYN's lookup to begin (the SYN's reader is behind)
/// and, once begun, to end; past either it looks the pid up itself.
const SYN_WAIT: Duration = Duration::from_secs(1);
const LOOKUP_WAIT: Duration = Duration::from_secs(10);
/// An early lookup no connection took (a SYN retransmitted, or to a port not watched) is dropped after this.
const KEPT: Duration = Duration::from_secs(60);

type Addrs = (SocketAddr, SocketAddr);

/// Lookups begun as each connection's SYN came, by (peer, ours). The tap reads the stream's packets a
/// block at a time, up to 100 ms after they came: a connection shorter than that (a scheduler's RPC to
/// a worker) was closed by then, its socket and so its opener gone.
#[derive(Default)]
pub struct EarlyPids {
    found: Mutex<HashMap<Addrs, (Instant, Option<i32>)>>, // None: looking
    told: Condvar,
}

impl EarlyPids {
    /// A SYN from `peer` to `ours` came: its opener is looked up now, while it surely holds the socket.
    pub fn syn(self: &Arc<Self>, peer: SocketAddr, ours: SocketAddr) {
        self.set((peer, ours), None);
        let me = self.clone();
        let _ = thread::Builder::new().name("syn-peer-pid".into()).spawn(move || {
            let pid = pid_of(&peer, &ours).unwrap_or(-1);
            me.set((peer, ours), Some(pid));
        });
    }

    fn set(&self, addrs: Addrs, pid: Option<i32>) {
        let mut found = self.found.lock().unwrap();
        found.retain(|_, (at, _)| at.elapsed() < KEPT);
        found.insert(addrs, (Instant::now(), pid));
        self.told.notify_all();
    }

    /// The connection's peer record, once its SYN's lookup ended; a connection joined midway (its first
    /// SYN not seen) or whose SYN went unread is looked up now.
    pub fn record_pid_of(self: &Arc<Self>, conn: u32, peer: SocketAddr, ours: SocketAddr, syn: bool,
                         tx: Sender<Vec<u8>>) {
        let me = self.clone();
        send_from_thread(conn, tx, move || {
            let early = if syn { me.take(&(peer, ours)) } else { None };
            early.unwrap_or_else(|| pid_of(&peer, &ours).unwrap_or(-1))
        });
    }

    fn take(&self, addrs: &Addrs) -> Option<i32> {
        let start = Instant::now();
        let mut found = self.found.lock().unwrap();
        loop {
            let waited = start.elapsed();
            let limit = match found.get(addrs) {
                Some((_, Some(pid))) => {
                    let pid = *pid;
                    found.remove(addrs);
                    return Some(pid);
                }
                Some((_, None)) => LOOKUP_WAIT,
                None => SYN_WAIT,
            };
            if waited >= limit {
                return None;
            }
            found = self.told.wait_timeout(found, limit - waited).unwrap().0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn finds_the_connecting_process_by_its_socket() {
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(host) else { continue }; // no IPv6 here
            let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            let (peer, ours) = (accepted.peer_addr().unwrap(), accepted.local_addr().unwrap());
            assert_eq!(pid_of(&peer, &ours), Some(std::process::id() as i32), "{host}");
            let other = SocketAddr::new(peer.ip(), peer.port() ^ 1);
            assert_eq!(socket_inode(&other, &ours), None, "no such socket: {host}");
            drop(client);
        }
    }

    #[test]
    fn a_connection_looked_up_at_its_syn_is_named_after_it_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (peer, local) = (accepted.peer_addr().unwrap(), accepted.local_addr().unwrap());
        let early = Arc::new(EarlyPids::default());
        early.syn(peer, local);
        let (tx, rx) = std::sync::mpsc::channel();
        early.record_pid_of(1, peer, local, true, tx.clone()); // waits for the SYN's lookup
        let named = rx.recv().unwrap();
        // A socket closed before its lookup, as no such socket: closing ours would not do, for a
        // parallel test's fork may hold it still
        let gone = SocketAddr::new(peer.ip(), peer.port() ^ 1);
        early.syn(gone, local);
        early.record_pid_of(2, gone, local, true, tx.clone());
        early.record_pid_of(3, gone, local, false, tx); // joined midway: looked up at once, too late
        drop((ours, accepted));
        assert_eq!(named, record::peer(1, std::process::id() as i32));
        let mut late = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        late.sort();
        assert_eq!(late, vec![record::peer(2, -1), record::peer(3, -1)]);
    }

    /// One scan finds the sockets of the lookups after it (a burst's), and a socket closed since, its fd
    /// taken by a new one, is not named from what the scan saw: the new one is found by scanning again.
    #[test]
    fn a_scan_serves_the_sockets_it_read_and_not_those_gone_since() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || {
            let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            let inode = socket_inode(&accepted.peer_addr().unwrap(), &accepted.local_addr().unwrap()).unwrap();
            (ours, accepted, inode)
        };
        let ((a, a_end, a_inode), (_b, _b_end, b_inode)) = (connect(), connect());
        let me = std::process::id() as i32;
        assert!(scan(me, a_inode));
        // (a parallel test's fork holds our fds too, and its scan may have been the last: either holder)
        assert!(seen(b_inode, &[]).is_some(), "b's socket was read with a's");
        drop((a, a_end));
        let (_c, _c_end, c_inode) = connect(); // the lowest free fds: a's
        assert_ne!(seen(a_inode, &[]), Some(me), "a is gone from us");
        assert_eq!(owner_of(c_inode), Some(me));
    }

    #[test]
    fn a_holder_gone_before_its_parent_was_read_is_not_named() {
        // A child holds every fd of its parent from its fork (a parallel test's fork held this one's
        // socket): found holding it, then killed and reaped before the climb read its parent, it was
        // named the opener (CI, once, beside load). The climb from it must name nobody, so that the
        // lookup is made again.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let inode = socket_inode(&accepted.peer_addr().unwrap(), &accepted.local_addr().unwrap()).unwrap();
        // SAFETY: the child only sleeps and exits (async-signal-safe), holding our fds the while
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::sleep(3);
                libc::_exit(0);
            }
        }
        let me = std::process::id() as i32;
        let alive = opener(child, inode);
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(alive, Some(me), "while the child lives, the climb from it reaches us");
        assert_eq!(opener(child, inode), None, "the child {child} is gone");
    }

    #[test]
    fn another_process_s_connection_is_its_own_after_ours_was_found() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(pid_of(&accepted.peer_addr().unwrap(), &accepted.local_addr().unwrap()),
                   Some(std::process::id() as i32));
        let mut child = std::process::Command::new("bash")
            .args(["-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; read -t 10 <&3")]).spawn().unwrap();
        listener.set_nonblocking(true).unwrap();
        let start = std::time::Instant::now();
        let theirs = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if start.elapsed().as_secs() < 10 && child.try_wait().unwrap().is_none() => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("bash did not connect ({e}): no /dev/tcp?"),
            }
        };
        let found = pid_of(&theirs.peer_addr().unwrap(), &theirs.local_addr().unwrap());
        drop(theirs);
        child.wait().unwrap();
        assert_eq!(found, Some(child.id() as i32));
    }

    #[test]
    fn a_connection_is_its_opener_s_not_a_child_s_that_inherited_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        OWNERS.lock().unwrap().clear(); // found by scanning, where the child is the newer holder
        // SAFETY: the child only sleeps and exits (async-signal-safe), holding our fds the while
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::sleep(3);
                libc::_exit(0);
            }
        }
        let found = pid_of(&accepted.peer_addr().unwrap(), &accepted.local_addr().unwrap());
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        drop(ours);
        assert_eq!(found, Some(std::process::id() as i32), "the child is {child}");
    }
}
