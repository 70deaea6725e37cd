//! Which process opened a connection: find the socket's inode in
//! /proc/net/tcp, then the process holding that inode. Runs off the
//! forwarding path, once per connection.

use std::fs;
use std::net::SocketAddr;

fn proc_hex(addr: &SocketAddr) -> Option<String> {
    match addr {
        SocketAddr::V4(a) => Some(format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(a.ip().octets()),
            a.port()
        )),
        SocketAddr::V6(_) => None,
    }
}

fn socket_inode(local: &SocketAddr, remote: &SocketAddr) -> Option<String> {
    let (local, remote) = (proc_hex(local)?, proc_hex(remote)?);
    let table = fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() > 9 && cols[1] == local && cols[2] == remote).then(|| cols[9].to_string())
    })
}

fn owner_of(inode: &str) -> Option<i32> {
    let target = format!("socket:[{inode}]");
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if fs::read_link(fd.path()).map_or(false, |l| l.as_os_str() == target.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

/// `peer` is the connecting side's address, `ours` the accepted socket's local one.
pub fn pid_of(peer: &SocketAddr, ours: &SocketAddr) -> Option<i32> {
    owner_of(&socket_inode(peer, ours)?)
}
