//! Opening the binaries a traced process maps (its interpreter and libpython), from which py-spy
//! takes the symbols both readers start from. The sampler runs as root, and the path
//! /proc/PID/maps names is the cluster user's: by the time it is opened it may be a FIFO (an open
//! that never returns), a symlink to /dev/zero or to a root-only file, or a huge sparse file; a
//! deleted file's path ends in " (deleted)", a name anyone may give another file. So py-spy (its
//! OPEN_MAPPED hook, vendor/py-spy) gets the mapping itself, through /proc/PID/map_files/START-END
//! (the very file the process maps, whatever its path names now); where root has no map_files, the
//! path under the process's root with no symlink followed, and only if it is the device and inode
//! the maps line has. Either way first as O_PATH (no FIFO waits, no device's open runs), then for
//! reading only if it is a regular file of at most MAX_FILE_BYTES. py-spy maps it, reading only the
//! pages of the headers and tables it parses. The rules are daskprobe-unwind's (unwind-core/src/open.rs)
//! and the eBPF agent's (probes/mapped_file.py).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// As daskprobe-unwind's: the largest libraries fit many times; what does not is most likely planted.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why a mapped binary was not read, as py-spy's error (the sampler's E line for the process).
fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::other(format!("{} not read ({why}): root reads no file a cluster's user may have planted",
                             path.display()))
}

fn open_at(dir: libc::c_int, name: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| io::Error::other("a NUL in the path"))?;
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `path` in the process's root, each component opened with O_NOFOLLOW from the one before
/// (maps paths are canonical: a "." or ".." is refused), the last as O_PATH.
fn under_root(pid: i32, path: &str) -> Result<OwnedFd, String> {
    let parts: Vec<&str> = path.strip_prefix('/').ok_or("not an absolute path")?.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err("not a canonical path".into());
    }
    let mut fd = open_at(libc::AT_FDCWD, &format!("/proc/{pid}/root"), libc::O_PATH | libc::O_DIRECTORY)
        .map_err(|e| e.to_string())?;
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        let flags = libc::O_PATH | libc::O_NOFOLLOW | if last { 0 } else { libc::O_DIRECTORY };
        fd = open_at(fd.as_raw_fd(), part, flags).map_err(|e| match e.raw_os_error() {
            // what O_NOFOLLOW makes of a symlink
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => "a symlink (or a file where a directory was) in its path".into(),
            _ => e.to_string(),
        })?;
    }
    Ok(fd)
}

/// The device and inode the maps line of the mapping START-END has.
fn mapped_file(pid: i32, range: &str) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps.lines().find(|l| l.split(' ').next() == Some(range))?;
    let mut fields = line.split_whitespace().skip(3);
    let (major, minor) = fields.next()?.split_once(':')?;
    let dev = libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    Some((dev, fields.next()?.parse().ok()?))
}

/// The file process `pid` maps at START-END (`path` as its maps line names it), opened for reading
/// if every check holds; else an error saying why (see the top of this file).
pub fn open_mapped(pid: i32, start: u64, end: u64, path: &Path) -> io::Result<File> {
    let range = format!("{start:x}-{end:x}");
    let (at, by_path) = match open_at(libc::AT_FDCWD, &format!("/proc/{pid}/map_files/{range}"), libc::O_PATH) {
        Ok(fd) => (fd, false),
        Err(_) if !Path::new(&format!("/proc/{pid}")).exists() => return Err(refused(path, "the process is gone")),
        // no map_files for us (a kernel without it, or no CAP_SYS_ADMIN)
        Err(_) => {
            let name = path.to_str().ok_or_else(|| refused(path, "not UTF-8"))?;
            (under_root(pid, name.trim_end_matches(" (deleted)")).map_err(|why| refused(path, &why))?, true)
        }
    };
    let meta = File::from(at.try_clone()?).metadata()?;
    if meta.file_type().is_symlink() {
        return Err(refused(path, "a symlink"));
    }
    if !meta.file_type().is_file() {
        return Err(refused(path, "not a regular file"));
    }
    if by_path && mapped_file(pid, &range) != Some((meta.dev(), meta.ino())) {
        return Err(refused(path, "not the file the process maps (another device or inode)"));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(refused(path, &format!("{} bytes, over the {MAX_FILE_BYTES}-byte cap", meta.len())));
    }
    // reopened through our own descriptor: the file just checked, whatever its path names now
    let own = format!("/proc/self/fd/{}", at.as_raw_fd());
    Ok(File::from(open_at(libc::AT_FDCWD, &own, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, FileTypeExt};

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sampler-mapped-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Our own executable's first mapping: opened through map_files, or by its path.
    #[test]
    fn a_mapped_file_is_opened_as_mapped() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let line = maps.lines().find(|l| l.ends_with(exe.to_str().unwrap())).unwrap();
        let (start, end) = line.split(' ').next().unwrap().split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        let file = open_mapped(std::process::id() as i32, start, end, &exe).unwrap();
        assert_eq!(file.metadata().unwrap().ino(), std::fs::metadata(&exe).unwrap().ino());
    }

    /// By path (no map_files): a symlink on the way is refused; a symlink or a FIFO at the end is
    /// opened as itself, at once (no wait for a FIFO's writer).
    #[test]
    fn by_path_no_symlink_is_followed_nor_a_fifo_waited_for() {
        let dir = scratch("by-path");
        let me = std::process::id() as i32;
        symlink("/dev/zero", dir.join("zero.so")).unwrap();
        // the last component: the link itself (O_PATH), which open_mapped refuses as not a regular file
        let at = under_root(me, dir.join("zero.so").to_str().unwrap()).unwrap();
        assert!(File::from(at).metadata().unwrap().file_type().is_symlink());
        symlink(&dir, dir.join("up")).unwrap();
        std::fs::write(dir.join("lib.so"), b"\x7fELF").unwrap();
        assert!(under_root(me, dir.join("up/lib.so").to_str().unwrap()).unwrap_err().contains("symlink"));
        assert!(under_root(me, dir.join("lib.so").to_str().unwrap()).is_ok());
        let fifo = dir.join("fifo.so");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let at = under_root(me, fifo.to_str().unwrap()).unwrap(); // O_PATH: no wait for a writer
        assert!(File::from(at).metadata().unwrap().file_type().is_fifo());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
