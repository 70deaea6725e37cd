//! The proxy's parts as a library: the framing parser, the capture records and their writer, and
//! who owns a connection. The proxy and the packet tap (src/bin/daskprobe-tap) both use them, and
//! tests and fuzzing drive the parser directly without a socket.

pub mod capture;
pub mod failures;
pub mod framing;
pub mod peer;
pub mod record;
