//! Opening a file a traced process mapped, by the path its maps line recorded. The unwinder runs
//! as root after the run, and a cluster's user controls those paths: a symlink planted in them
//! (to /dev/zero, to a root-only file), a FIFO (an open that never returns), a huge sparse file
//! (all of it read). So a file is read only when every check holds, and otherwise skipped with
//! its reason (the frames in it stay unnamed).

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use crate::maps::Mapping;

/// Files larger than this are not read: the largest libraries (a browser's, 150 MB) fit many
/// times; what does not is most likely planted. docs/probes.md says it.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why a mapped file was not read.
#[derive(Clone, Debug, PartialEq)]
pub enum Skip {
    Gone,
    Symlink,
    NotRegular,
    TooLarge(u64),
    Replaced,
    NotReadable,
    NotElf,
    Io(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Skip::Gone => write!(f, "not there (deleted, a memfd, or a file of another host)"),
            Skip::Symlink => write!(f, "a symlink (or a file where a directory was) in its path"),
            Skip::NotRegular => write!(f, "not a regular file"),
            Skip::TooLarge(n) => write!(f, "{n} bytes, over the {MAX_FILE_BYTES}-byte cap"),
            Skip::Replaced => write!(f, "not the file the process mapped (another device or inode)"),
            Skip::NotReadable => write!(f, "not readable by the process's user"),
            Skip::NotElf => write!(f, "not an ELF file"),
            Skip::Io(e) => write!(f, "{e}"),
        }
    }
}

fn last_error(symlink_means: Skip) -> Skip {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // O_NOFOLLOW on a symlink: ELOOP; a symlink where a directory was asked for: ENOTDIR
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => symlink_means,
        Some(libc::ENOENT) => Skip::Gone,
        _ => Skip::Io(e.to_string()),
    }
}

fn openat(dir: libc::c_int, name: &str, flags: libc::c_int) -> Result<OwnedFd, Skip> {
    let c = CString::new(name).map_err(|_| Skip::Io("a NUL in the path".into()))?;
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(last_error(Skip::Symlink));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The file at an absolute path with no symlink anywhere in it: each component opened with
/// O_NOFOLLOW from the one before (/proc/PID/maps paths are canonical: no "." or ".."). The last one
/// as O_PATH, which opens nothing (no FIFO waits, no device's open runs); opened for reading only
/// once it is known to be a regular file, through our own descriptor.
fn open_no_symlinks(path: &str) -> Result<File, Skip> {
    let parts: Vec<&str> = path.strip_prefix('/').ok_or(Skip::Io("not an absolute path".into()))?.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err(Skip::Io("not a canonical path".into()));
    }
    let mut dir = openat(libc::AT_FDCWD, "/", libc::O_PATH | libc::O_DIRECTORY)?;
    for part in &parts[..parts.len() - 1] {
        dir = openat(dir.as_raw_fd(), part, libc::O_PATH | libc::O_DIRECTORY)?;
    }
    let at = openat(dir.as_raw_fd(), parts[parts.len() - 1], libc::O_PATH)?;
    let meta = File::from(at.try_clone().map_err(|e| Skip::Io(e.to_string()))?).metadata().map_err(|e| Skip::Io(e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(Skip::Symlink);
    }
    if !meta.file_type().is_file() {
        return Err(Skip::NotRegular);
    }
    // reopened for reading through our own descriptor's magic link: the file just checked
    let own = CString::new(format!("/proc/self/fd/{}", at.as_raw_fd())).unwrap();
    let fd = unsafe { libc::open(own.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Skip::Io(std::io::Error::last_os_error().to_string()));
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(File::from(fd))
}

/// Whether a process of user `uid` could read a file of this owner and mode. Without the uid (a
/// capture made before it was recorded), only a file anyone may read. Group permissions are not
/// weighed (the process's groups are not recorded): a file only its group may read is skipped.
fn readable_by(uid: Option<u32>, owner: u32, mode: u32) -> bool {
    mode & 0o004 != 0 || uid == Some(0) || (uid == Some(owner) && mode & 0o400 != 0)
}

/// The bytes of the file a mapping names, if every check holds: no symlink in its path, a regular
/// file, at most MAX_FILE_BYTES, the device and inode the maps line recorded (if it did), and
/// readable by the process's user.
pub fn read_mapped(m: &Mapping) -> Result<Vec<u8>, Skip> {
    let file = open_no_symlinks(m.path.trim_end_matches(" (deleted)"))?;
    let meta = file.metadata().map_err(|e| Skip::Io(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(Skip::NotRegular);
    }
    if let Some((dev, inode)) = m.file {
        if (meta.dev(), meta.ino()) != (dev, inode) {
            return Err(Skip::Replaced);
        }
    }
    if !readable_by(m.uid, meta.uid(), meta.mode()) {
        return Err(Skip::NotReadable);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(Skip::TooLarge(meta.len()));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    // it may grow after the check: never past the cap
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut data).map_err(|e| Skip::Io(e.to_string()))?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(Skip::TooLarge(data.len() as u64));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn mapping(path: &std::path::Path, file: Option<(u64, u64)>, uid: Option<u32>) -> Mapping {
        Mapping { start: 0, end: 0, offset: 0, path: path.to_str().unwrap().to_string(), file, uid }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("unwind-open-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_plain_file_is_read_and_every_planted_one_skipped() {
        let dir = scratch("checks");
        let lib = dir.join("lib.so");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        let meta = std::fs::metadata(&lib).unwrap();
        let me = Some(unsafe { libc::getuid() });
        assert_eq!(read_mapped(&mapping(&lib, Some((meta.dev(), meta.ino())), me)).unwrap(), b"\x7fELF");
        // a symlink as the file, and as a directory on its way
        symlink("/dev/zero", dir.join("zero.so")).unwrap();
        assert_eq!(read_mapped(&mapping(&dir.join("zero.so"), None, me)), Err(Skip::Symlink));
        symlink(&dir, dir.join("up")).unwrap();
        assert_eq!(read_mapped(&mapping(&dir.join("up").join("lib.so"), None, me)), Err(Skip::Symlink));
        // a FIFO: skipped at once, not an open that waits for a writer
        let fifo = dir.join("fifo.so");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert_eq!(read_mapped(&mapping(&fifo, None, me)), Err(Skip::NotRegular));
        // a sparse file past the cap: not read
        let huge = dir.join("huge.so");
        File::create(&huge).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(read_mapped(&mapping(&huge, None, me)), Err(Skip::TooLarge(MAX_FILE_BYTES + 1)));
        // another file than the one mapped
        assert_eq!(read_mapped(&mapping(&lib, Some((meta.dev(), meta.ino() + 1)), me)), Err(Skip::Replaced));
        // a file the process's user could not read
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o600)).unwrap();
        let other = Some(unsafe { libc::getuid() } + 1);
        assert_eq!(read_mapped(&mapping(&lib, None, other)), Err(Skip::NotReadable));
        assert_eq!(read_mapped(&mapping(&lib, None, None)), Err(Skip::NotReadable));
        assert!(read_mapped(&mapping(&lib, None, me)).is_ok());
        assert_eq!(read_mapped(&mapping(&dir.join("gone.so"), None, me)), Err(Skip::Gone));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readable_means_by_others_or_by_its_owner() {
        assert!(readable_by(None, 0, 0o644));
        assert!(!readable_by(None, 1000, 0o600));
        assert!(readable_by(Some(1000), 1000, 0o600));
        assert!(!readable_by(Some(1000), 0, 0o711));
        assert!(!readable_by(Some(1000), 1000, 0o100));
        assert!(readable_by(Some(0), 5, 0o000));
    }
}
